"""Stand-ins for the data object LAMMPS's ML-IAP hands a unified model, for tests without an
ML-IAP LAMMPS.

Written from LAMMPS's own code, read for this file (lammps/lammps):

- ``src/ML-IAP/mliap_unified_couple.pyx`` (``MLIAPDataPy``, CPU): numpy views over LAMMPS's
  arrays; ``eatoms``, ``energy`` write-only setters; ``update_pair_forces`` takes a
  ``double[:, ::1]`` memoryview;
- ``src/KOKKOS/mliap_unified_couple_kokkos.pyx`` (``MLIAPDataPy``, KOKKOS): arrays from
  ``create_array`` (numpy views in a host build, ``dev == 0``; CuPy over device memory in a
  CUDA build, ``dev == 1``); ``eatoms`` a getter filled in place; ``update_pair_forces_gpu``
  takes a raw pointer (``.data.ptr`` of CuPy, else ``.data_ptr()`` of torch) and checks
  nothing; since PR #4463 ``forward_exchange`` / ``reverse_exchange(src, dst, vec_len)``
  (``/work/shared/reference/lammps-mliap-unified.md`` section 3);
- ``src/ML-IAP/mliap_unified.cpp`` (``update_pair_forces``: ``f[i] += fij``, ``f[j] -= fij``,
  ``v_tally`` when ``data->vflag``; energy untouched), ``src/ML-IAP/pair_mliap.cpp``
  (``e_tally``, ``v_tally``; ``Pair::ev_setup`` for the flags), ``src/ML-IAP/mliap_data.cpp``
  and ``src/KOKKOS/mliap_data_kokkos.cpp`` (arrays, ``energy`` never reset, ``eatoms`` grown
  only when a rank first lists atoms).

Cython's pointer-to-array casts (``<double[:n]> ptr``) refuse ``n == 0``; the stand-ins do
too. What LAMMPS leaves undefined (reading past a buffer, a host pointer in a device build)
raises here instead of crashing. Not emulated: ``gamma*``, ``graddesc``, ``descriptors``,
``betas``, ``update_pair_energy``, and the KOKKOS ``numneighs`` view (built as float64 over
int32 memory upstream).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

ENERGY_GLOBAL, ENERGY_ATOM = 1, 2
VIRIAL_PAIR, VIRIAL_FDOTR, VIRIAL_ATOM, VIRIAL_CENTROID = 1, 2, 4, 8
#: ``MLIAPData::energy`` before any model set it (LAMMPS leaves it uninitialised).
STALE_ENERGY = float("nan")


@dataclass(frozen=True)
class RankArrays:
    """What ``MLIAPData::generate_neighdata`` leaves for one rank: the same atoms and pairs
    ``pair_style nvalchemi`` hands its model (rows: owned first, then ghosts)."""

    nlocal: int
    elems: np.ndarray  # (ntotal,) int32, -1 for NULL types
    pair_i: np.ndarray  # (npairs,) int32
    pair_j: np.ndarray  # (npairs,) int32 (jatoms)
    rij: np.ndarray  # (npairs, 3) float64

    @classmethod
    def of(cls, nlocal: int, species, pair_i, pair_j, rij) -> RankArrays:
        return cls(
            int(nlocal),
            np.ascontiguousarray(species, dtype=np.int32),
            np.ascontiguousarray(pair_i, dtype=np.int32),
            np.ascontiguousarray(pair_j, dtype=np.int32),
            np.ascontiguousarray(np.reshape(rij, (-1, 3)), dtype=np.float64),
        )

    @property
    def ntotal(self) -> int:
        return int(self.elems.shape[0])

    @property
    def npairs(self) -> int:
        return int(self.pair_i.shape[0])


def _scatter_add(xp: Any, target, index, values) -> None:
    # numpy's and CuPy's ufunc ``at`` (CuPy 14 deprecates cupyx.scatter_add for it)
    xp.add.at(target, index, values)


class PairState:
    """The LAMMPS side that outlives one ``compute_forces`` call: ``MLIAPData``'s memory and
    ``PairMLIAP``'s tallies, on the host (``numpy``) or the GPU (``cupy``).

    :param eflag: LAMMPS's raw energy flags (``ENERGY_GLOBAL | ENERGY_ATOM``)
    :param vflag: LAMMPS's raw virial flags; ``VIRIAL_FDOTR`` alone means the global virial
        comes later from ``virial_fdotr_compute`` (``Pair::ev_setup``)
    """

    def __init__(
        self, arrays: RankArrays, eflag: int = 3, vflag: int = 6, xp: Any = np, stream=None
    ) -> None:
        self.arrays, self.xp, self.stream = arrays, xp, stream
        self.eflag, self.vflag = eflag, vflag
        self.eflag_global, self.eflag_atom = eflag & ENERGY_GLOBAL, eflag & ENERGY_ATOM
        self.vflag_global = vflag & (VIRIAL_PAIR | VIRIAL_FDOTR)
        self.vflag_atom = vflag & (VIRIAL_ATOM | VIRIAL_CENTROID)
        if self.vflag_global == VIRIAL_FDOTR:
            self.vflag_global = 0
        n = arrays.ntotal
        self.elems = xp.asarray(arrays.elems)
        self.pair_i = xp.asarray(arrays.pair_i)
        self.jatoms = xp.asarray(arrays.pair_j)
        self.rij = xp.asarray(arrays.rij)
        self.f = xp.zeros((n, 3))
        self.nlistatoms = arrays.nlocal  # list->inum: every owned atom
        # memory->grow leaves eatoms uninitialised, and NULL until a rank first lists atoms
        self.eatoms = xp.full(self.nlistatoms, np.nan) if self.nlistatoms else None
        self.energy = STALE_ENERGY
        self.eng_vdwl = 0.0
        self.virial = np.zeros(6)
        self.eatom = np.zeros(n)
        self.vatom = xp.zeros((n, 6))
        self.fij = None  # what the model handed to update_pair_forces (numpy or CuPy)
        # KOKKOS ML-IAP's allocated pairs: LAMMPS as released sizes them to exactly the
        # pairs of the step that outgrew them (MLIAPDataKokkos::grow_neigharrays)
        self.nneigh_max = arrays.npairs
        self.calls: list[tuple[str, int]] = []

    def update_pair_forces(self, fij) -> None:
        """``LAMMPS_NS::update_pair_forces``: forces onto both atoms of each pair, and the
        pair virial through ``v_tally`` when ``data->vflag``; energies untouched."""
        self.calls.append(("update_pair_forces", self.arrays.npairs))
        if self.stream is not None:  # a CuPy stream of its own, as Kokkos has
            with self.stream:
                self._update_pair_forces(fij)
        else:
            self._update_pair_forces(fij)

    def _update_pair_forces(self, fij) -> None:
        xp = self.xp
        fij = fij.reshape(-1, 3)
        self.fij = fij.copy()
        _scatter_add(xp, self.f, self.pair_i, fij)
        _scatter_add(xp, self.f, self.jatoms, -fij)
        if self.vflag:  # PairMLIAP::v_tally
            r = self.rij
            v = -xp.stack(
                [
                    r[:, 0] * fij[:, 0],
                    r[:, 1] * fij[:, 1],
                    r[:, 2] * fij[:, 2],
                    r[:, 0] * fij[:, 1],
                    r[:, 0] * fij[:, 2],
                    r[:, 1] * fij[:, 2],
                ],
                axis=1,
            )
            if self.vflag_global:
                self.virial += _host(v.sum(axis=0))
            if self.vflag_atom:
                _scatter_add(xp, self.vatom, self.pair_i, 0.5 * v)
                _scatter_add(xp, self.vatom, self.jatoms, 0.5 * v)

    def e_tally(self, assign: bool = False) -> None:
        """``PairMLIAP::e_tally`` after the callbacks: ``eng_vdwl += energy``; per-atom
        energies by list position, ``eatom[iatoms[ii]] += eatoms[ii]`` (the KOKKOS pair
        assigns)."""
        if self.eflag_global:
            self.eng_vdwl += self.energy
        if self.eflag_atom and self.nlistatoms:
            values = _host(self.eatoms)
            iatoms = np.arange(self.nlistatoms)  # ilist: owned atoms in order
            if assign:
                self.eatom[iatoms] = values
            else:
                self.eatom[iatoms] += values


def _host(array) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.get()


def _cython_view(array):
    """``np.asarray(<T[:n]> ptr)``: Cython refuses a zero extent."""
    for axis, extent in enumerate(array.shape):
        if extent <= 0:
            raise ValueError(f"Invalid shape in axis {axis}: {extent}.")
    return array


def _typed_memoryview(value, ndim: int, c_contiguous: bool) -> memoryview:
    """``cdef double[:, ::1] view = value`` (or ``double[:]``): a writable float64 buffer of
    the right rank, C-contiguous when asked."""
    try:
        view = memoryview(value)
    except TypeError:
        raise TypeError(f"a bytes-like object is required, not '{type(value).__name__}'") from None
    if view.format not in ("d", "<d", "=d"):
        raise ValueError(f"Buffer dtype mismatch, expected 'double' but got '{view.format}'")
    if view.ndim != ndim:
        raise ValueError(
            f"Buffer has wrong number of dimensions (expected {ndim}, got {view.ndim})"
        )
    if c_contiguous and not view.c_contiguous:
        raise ValueError("ndarray is not C-contiguous")
    if view.readonly:
        raise ValueError("buffer source array is read-only")
    return view


class CpuData:
    """``MLIAPDataPy`` of CPU ML-IAP (``mliap_unified_couple.pyx``): no exchanges."""

    def __init__(self, state: PairState) -> None:
        self._s = state
        self._a = state.arrays

    # counts
    ntotal = property(lambda self: self._a.ntotal)
    nlocal = property(lambda self: self._a.nlocal)
    nlistatoms = property(lambda self: self._s.nlistatoms)
    natomneigh = property(lambda self: self._s.nlistatoms)
    npairs = property(lambda self: self._a.npairs)
    eflag = property(lambda self: self._s.eflag)
    vflag = property(lambda self: self._s.vflag)
    ndescriptors = property(lambda self: 1)
    nparams = property(lambda self: 1)

    # arrays: views of LAMMPS's memory
    elems = property(lambda self: _cython_view(self._s.elems))
    pair_i = property(lambda self: _cython_view(self._s.pair_i))
    jatoms = property(lambda self: _cython_view(self._s.jatoms))
    pair_j = jatoms
    rij = property(lambda self: _cython_view(self._s.rij))
    f = property(lambda self: _cython_view(self._s.f))
    iatoms = property(lambda self: _cython_view(np.arange(self._s.nlistatoms, dtype=np.int32)))

    def _set_eatoms(self, value) -> None:
        if self._s.eatoms is None:
            raise ValueError("attempt to set NULL eatoms")
        target = _cython_view(self._s.eatoms)
        source = np.asarray(_typed_memoryview(value, 1, c_contiguous=False))
        if source.shape != target.shape:
            raise ValueError(
                f"got differing extents in dimension 0 (got {target.shape[0]} and "
                f"{source.shape[0]})"
            )
        target[:] = source

    eatoms = property(fset=_set_eatoms)  # write-only

    def _set_energy(self, value) -> None:
        self._s.energy = float(value)  # <double>value

    energy = property(fset=_set_energy)  # write-only

    def update_pair_forces(self, fij) -> None:
        view = _typed_memoryview(fij, 2, c_contiguous=True)
        values = np.asarray(view)
        for axis in range(2):
            if values.shape[axis] == 0:  # &fij_arr[0][0]
                raise IndexError(f"Out of bounds on buffer access (axis {axis})")
        needed = 3 * self._a.npairs
        if values.size < needed:
            raise RuntimeError("update_pair_forces would read past the end of fij")
        self._s.update_pair_forces(values.reshape(-1)[:needed])


def _pointer(obj) -> int:
    """``ptr = obj.data.ptr`` (CuPy), else ``obj.data_ptr()`` (torch), as the pyx does."""
    try:
        return int(obj.data.ptr)
    except AttributeError:
        return int(obj.data_ptr())


def _raw(obj, count: int, dtype: np.dtype, dev: int):
    """``count`` values of ``dtype`` at ``obj``'s pointer, as LAMMPS reads them: whatever
    the object's own dtype, shape or strides. Reads outside the allocation, or a pointer on
    the wrong side of the host/device divide, raise here (undefined behaviour in LAMMPS)."""
    dtype = np.dtype(dtype)
    ptr = _pointer(obj)
    on_gpu = hasattr(obj, "__cuda_array_interface__")
    if on_gpu != (dev == 1):
        where = "device" if on_gpu else "host"
        raise RuntimeError(f"a {where} pointer handed to a dev={dev} Kokkos build")
    if hasattr(obj, "untyped_storage"):  # torch
        storage = obj.untyped_storage()
        start, size = storage.data_ptr(), storage.nbytes()
    else:  # cupy
        start, size = obj.data.mem.ptr, obj.data.mem.size
    if count and not start <= ptr <= ptr + count * dtype.itemsize <= start + size:
        raise RuntimeError("LAMMPS would read past the end of the buffer")
    if count == 0:
        return np.zeros(0, dtype) if dev == 0 else _cupy().zeros(0, dtype)
    if dev == 0:
        ctype = {np.dtype(np.float64): ctypes.c_double, np.dtype(np.float32): ctypes.c_float}
        return np.ctypeslib.as_array((ctype[dtype] * count).from_address(ptr))
    cp = _cupy()
    memory = cp.cuda.UnownedMemory(ptr, count * dtype.itemsize, obj)
    return cp.ndarray((count,), dtype, memptr=cp.cuda.MemoryPointer(memory, 0))


def _cupy():
    import cupy

    return cupy


class KokkosData:
    """``MLIAPDataPy`` of KOKKOS ML-IAP (``mliap_unified_couple_kokkos.pyx``) before PR
    #4463: arrays through ``create_array``, raw-pointer updates, no exchanges.

    :param dev: 0 for a host Kokkos build (numpy views), 1 for a CUDA build (CuPy views of
        the state's CuPy arrays)
    """

    def __init__(self, state: PairState, dev: int = 0) -> None:
        self._s, self._a, self.dev = state, state.arrays, dev

    def _array(self, array):  # create_array(dev, pointer, shape, is_int)
        return _cython_view(array) if self.dev == 0 else array

    ntotal = property(lambda self: self._a.ntotal)
    nlocal = property(lambda self: self._a.nlocal)
    nlistatoms = property(lambda self: self._s.nlistatoms)
    npairs = property(lambda self: self._a.npairs)
    nneigh_max = property(lambda self: self._s.nneigh_max)
    eflag = property(lambda self: self._s.eflag)
    vflag = property(lambda self: self._s.vflag)
    ndescriptors = property(lambda self: 1)
    nparams = property(lambda self: 1)
    elems = property(lambda self: self._array(self._s.elems))
    pair_i = property(lambda self: self._array(self._s.pair_i))
    jatoms = property(lambda self: self._array(self._s.jatoms))
    pair_j = jatoms
    rij = property(lambda self: self._array(self._s.rij))
    f = property(lambda self: self._array(self._s.f))

    @property
    def eatoms(self):  # a getter over LAMMPS's memory: fill it in place (no setter)
        if self._s.eatoms is None:
            raise ValueError("attempt to set NULL eatoms")
        return self._array(self._s.eatoms)

    def _set_energy(self, value) -> None:
        self._s.energy = float(value)  # self.data.energy[0] = <double>value

    energy = property(fset=_set_energy)

    def update_pair_forces_gpu(self, fij) -> None:
        self._s.update_pair_forces(_raw(fij, 3 * self._a.npairs, np.float64, self.dev))

    def update_pair_forces_cpu(self, fij) -> None:
        try:
            view = _typed_memoryview(fij, 2, c_contiguous=True)
        except TypeError:  # the pyx falls back to a float64 numpy copy of a torch tensor
            view = memoryview(np.ascontiguousarray(fij.detach().numpy(), dtype=np.float64))
        values = np.asarray(view)
        if values.size == 0:
            raise IndexError("Out of bounds on buffer access (axis 0)")
        self._s.update_pair_forces(values.reshape(-1)[: 3 * self._a.npairs])

    def update_pair_forces(self, fij) -> None:
        if self.dev == 0:
            self.update_pair_forces_cpu(fij)
        else:
            self.update_pair_forces_gpu(fij)


class SelfExchange:
    """LAMMPS's ghost communication on one rank: every ghost is a periodic image of an owned
    atom of the same rank, ``owner_row[ghost]``. Works on numpy or CuPy rows in place."""

    def __init__(self, nlocal: int, owner_row: np.ndarray, xp: Any = np) -> None:
        self.nlocal = nlocal
        self.ghost_owner = xp.asarray(np.asarray(owner_row[nlocal:], dtype=np.int64))
        self.xp = xp

    def forward(self, rows) -> None:
        rows[self.nlocal :] = rows[self.ghost_owner]

    def reverse(self, rows) -> None:
        ghosts = rows[self.nlocal :].copy()
        _scatter_add(self.xp, rows, self.ghost_owner, ghosts)
        rows[self.nlocal :] = 0.0


class WorldExchange:
    """LAMMPS's ghost communication between ranks played by threads, through
    ``tests/_systems.RankCollectives`` (float64 host buffers, as MPI carries doubles)."""

    def __init__(self, collectives: Any) -> None:
        self.collectives = collectives

    def _through(self, method, rows) -> None:
        buffer = np.ascontiguousarray(_host(rows), dtype=np.float64)
        method(memoryview(buffer), int(rows.shape[1]))
        rows[...] = buffer if isinstance(rows, np.ndarray) else _cupy().asarray(buffer)

    def forward(self, rows) -> None:
        self._through(self.collectives.forward_exchange, rows)

    def reverse(self, rows) -> None:
        self._through(self.collectives.reverse_exchange, rows)


class KokkosExchangeData(KokkosData):
    """KOKKOS ML-IAP since PR #4463: ``forward_exchange`` / ``reverse_exchange`` on
    ``(ntotal, vec_len)`` float32/float64 rows at raw pointers.

    :param exchange: :class:`SelfExchange` or :class:`WorldExchange`
    """

    def __init__(self, state: PairState, exchange: Any, dev: int = 0) -> None:
        super().__init__(state, dev)
        self._exchange = exchange

    def _rows(self, src, dst, vec_len: int):
        dtype = np.dtype(str(src.dtype).replace("torch.", ""))
        if dtype not in (np.float32, np.float64) or str(dst.dtype) != str(src.dtype):
            raise TypeError(f"exchange of {src.dtype} into {dst.dtype}: wanted float32 or float64")
        count = self._a.ntotal * int(vec_len)
        source = _raw(src, count, dtype, self.dev)
        target = _raw(dst, count, dtype, self.dev)
        target[...] = source  # all ntotal rows first, then the communication
        return target.reshape(self._a.ntotal, int(vec_len))

    def forward_exchange(self, src, dst, vec_len: int) -> None:
        """Ghost rows of ``dst`` take their owners' rows of ``src``."""
        self._s.calls.append(("forward_exchange", int(vec_len)))
        self._exchange.forward(self._rows(src, dst, vec_len))

    def reverse_exchange(self, src, dst, vec_len: int) -> None:
        """Ghost rows of ``src`` are added into their owners' rows; ghost rows of ``dst``
        are zero."""
        self._s.calls.append(("reverse_exchange", int(vec_len)))
        self._exchange.reverse(self._rows(src, dst, vec_len))


def run_callbacks(model: Any, data: Any, state: PairState, kokkos: bool) -> None:
    """What ``PairMLIAP::compute`` does around the model: the three Python callbacks, then
    ``e_tally``."""
    model.compute_descriptors(data)
    model.compute_gradients(data)
    model.compute_forces(data)
    state.e_tally(assign=kokkos)
