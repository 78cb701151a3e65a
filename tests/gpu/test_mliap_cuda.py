"""GPU check of the ML-IAP front door (``pair_style mliap unified``, KOKKOS on a CUDA GPU),
without LAMMPS.

    .venv/bin/python -m pytest -m gpu tests/gpu/test_mliap_cuda.py

It builds the KOKKOS stand-in of ``tests/mliap_standin.py`` over CuPy arrays in GPU memory
(``dev == 1``: what ``mliap_unified_couple_kokkos.pyx`` hands a model), with LAMMPS's side
working on a CUDA stream of its own as Kokkos does, and runs ``MLIAPModel.compute_forces``
on one rank of a periodic fcc Ar/Ne crystal (ghost atoms = periodic images) for
Lennard-Jones, a 3-layer message-passing model (ghost features exchanged on the device), a
float32 Lennard-Jones, and MACE where mace-torch is importable. For each it checks:

- zero-copy: the tensors the model reads are LAMMPS's own GPU memory;
- same numbers: energy, per-atom energies and pair forces equal the CPU path (the CPU
  ML-IAP stand-in over numpy; the host-Kokkos one for the message-passing model, which
  needs the exchange) to 1e-12 relative in float64 (1e-5 for float32);
- pair forces handed to ``update_pair_forces_gpu`` as a contiguous float64 CUDA tensor;
- no host round trip: inside ``compute_forces`` no copy between host and device larger
  than 8 bytes (the CUDA profiler's memcpy records; device-to-device copies do not count;
  the engine reads back two scalars, the energy LAMMPS wants as a double and its
  finite-positions flag), and no call of
  ``Tensor.cpu``/``Tensor.numpy``/``cupy.asnumpy``/``cupy.ndarray.get``;
- Kokkos's stream: pair vectors written on LAMMPS's stream just before the call (behind a
  busy kernel) are read only once written, with torch on its default stream (the legacy
  default stream, which CUDA orders against Kokkos's blocking stream) and on a stream of
  its own (the adapter then waits for the device).

Each model is one test; it fails with the checks that did not pass.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from mliap_standin import (
    CpuData,
    KokkosData,
    KokkosExchangeData,
    PairState,
    RankArrays,
    SelfExchange,
)

from nvalchemi_lammps import LennardJones, MessagePassing, save_model

FCC = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
LATTICE = 4.1
#: Largest host<->device copy allowed inside compute_forces (one float64 scalar).
SCALAR_BYTES = 8


@dataclass
class Row:
    model: str
    check: str
    passed: bool
    detail: str


def periodic_rank(cells: int, cutoff: float, seed: int = 0) -> tuple[RankArrays, np.ndarray]:
    """One rank owning a whole periodic fcc crystal: owned atoms, then every periodic image
    within ``cutoff`` of one as a ghost row. Returns the arrays and each row's owner row."""
    rng = np.random.default_rng(seed)
    grid = np.array([[i, j, k] for i in range(cells) for j in range(cells) for k in range(cells)])
    length = cells * LATTICE
    x = (grid[:, None] + FCC[None]).reshape(-1, 3) * LATTICE
    x = x + rng.normal(0.0, 0.1, x.shape)
    n = len(x)
    reach = math.ceil(cutoff / length)
    shifts = np.array(
        [
            [a, b, c]
            for a in range(-reach, reach + 1)
            for b in range(-reach, reach + 1)
            for c in range(-reach, reach + 1)
        ]
    )
    pair_i, pair_j, rij, owner = [], [], [], list(range(n))
    ghost_row: dict[tuple[int, int], int] = {}
    for s, shift in enumerate(shifts):
        d = x[None, :, :] + shift * length - x[:, None, :]  # (i, j, 3)
        i, j = np.nonzero((d * d).sum(-1) < cutoff * cutoff)
        keep = (i != j) | shift.any()
        i, j = i[keep], j[keep]
        if shift.any():
            rows = []
            for atom in j:
                key = (s, int(atom))
                if key not in ghost_row:
                    ghost_row[key] = len(owner)
                    owner.append(int(atom))
                rows.append(ghost_row[key])
            rows = np.array(rows, dtype=np.int64)
        else:
            rows = j
        pair_i.append(i)
        pair_j.append(rows)
        rij.append(d[i, j])
    order_i = np.concatenate(pair_i)
    order = np.argsort(order_i, kind="stable")  # ML-IAP's pairs come grouped by receiver
    owner_row = np.array(owner, dtype=np.int64)
    species = (rng.random(n) < 0.4).astype(np.int64)[owner_row]
    arrays = RankArrays.of(
        n, species, order_i[order], np.concatenate(pair_j)[order], np.concatenate(rij)[order]
    )
    return arrays, owner_row


def _relative(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    return float(np.abs(got - ref).max() / scale) if scale else float(np.abs(got).max())


@contextlib.contextmanager
def _no_bulk_host_copies(cp) -> Iterator[list[str]]:
    """Calls that copy arrays to the host raise while the block runs."""
    called: list[str] = []
    saved = [(torch.Tensor, "cpu"), (torch.Tensor, "numpy"), (cp, "asnumpy"), (cp.ndarray, "get")]
    originals = [getattr(owner, name) for owner, name in saved]

    def refuse(label: str) -> Callable:
        def refused(*args, **kwargs):
            called.append(label)
            raise RuntimeError(f"{label} called in the hot path")

        return refused

    try:
        for owner, name in saved:
            setattr(owner, name, refuse(name))
        yield called
    finally:
        for (owner, name), original in zip(saved, originals):
            setattr(owner, name, original)


def _memcpys(run: Callable[[], None]) -> list[tuple[str, int]]:
    """``(kind, bytes)`` of every CUDA memcpy the profiler records while ``run`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    copies = []
    for event in events:
        if event.get("cat") == "gpu_memcpy":
            copies.append((event.get("name", "?"), int(event.get("args", {}).get("bytes", -1))))
    return copies


def _spin_kernel(cp):
    return cp.RawKernel(
        r"""
        extern "C" __global__ void spin(long long cycles) {
            long long start = clock64();
            while (clock64() - start < cycles) {}
        }
        """,
        "spin",
    )


def check_model(
    name: str,
    path: Path,
    arrays: RankArrays,
    owner_row: np.ndarray,
    exchange: bool,
    tol: float,
    repeats: int,
    cp,
) -> list[Row]:
    rows: list[Row] = []
    # LAMMPS's own stream, made as Kokkos makes its default CUDA instance's
    # (cudaStreamCreate: a blocking stream, ordered against the legacy default stream)
    stream = cp.cuda.Stream(non_blocking=False)

    # the CPU path
    cpu_state = PairState(arrays)
    if exchange:
        cpu_data = KokkosExchangeData(cpu_state, SelfExchange(arrays.nlocal, owner_row), dev=0)
    else:
        cpu_data = CpuData(cpu_state)
    cpu_model = torch.load(path, weights_only=False)
    cpu_model.compute_forces(cpu_data)
    start = time.perf_counter()
    for _ in range(repeats):
        cpu_model.compute_forces(cpu_data)
    cpu_ms = 1e3 * (time.perf_counter() - start) / repeats

    # the GPU path
    gpu_state = PairState(arrays, xp=cp, stream=stream)
    if exchange:
        gpu_data = KokkosExchangeData(
            gpu_state, SelfExchange(arrays.nlocal, owner_row, xp=cp), dev=1
        )
    else:
        gpu_data = KokkosData(gpu_state, dev=1)
    handed = []
    update = gpu_data.update_pair_forces_gpu

    def recording_update(fij):
        handed.append(
            (
                type(fij).__name__,
                str(getattr(fij, "dtype", "?")),
                str(getattr(fij, "device", "?")),
                bool(fij.is_contiguous()),
            )
        )
        update(fij)

    gpu_data.update_pair_forces_gpu = recording_update
    gpu_model = torch.load(path, weights_only=False)
    gpu_model.compute_forces(gpu_data)  # moves the model to the GPU, warms up
    torch.cuda.synchronize()

    rij = torch.as_tensor(gpu_data.rij)
    zero_copy = rij.is_cuda and rij.data_ptr() == gpu_state.rij.data.ptr
    rows.append(
        Row(name, "zero-copy inputs", zero_copy, f"rij on {rij.device}, same pointer: {zero_copy}")
    )

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        gpu_model.compute_forces(gpu_data)
    torch.cuda.synchronize()
    gpu_ms = 1e3 * (time.perf_counter() - start) / repeats

    diffs = {
        "energy": _relative([gpu_state.energy], [cpu_state.energy]),
        "eatoms": _relative(gpu_state.eatoms.get(), cpu_state.eatoms),
        "fij": _relative(gpu_state.fij.get(), cpu_state.fij),
    }
    rows.append(
        Row(
            name,
            f"equals CPU path (<= {tol:g})",
            max(diffs.values()) <= tol,
            ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()),
        )
    )
    kind = handed[-1] if handed else None
    ok = kind is not None and kind[1] == "torch.float64" and "cuda" in kind[2] and kind[3]
    rows.append(Row(name, "fij contiguous float64 on GPU", ok, f"{kind}"))

    called: list[str] = []
    errors: list[str] = []

    def guarded() -> None:
        with _no_bulk_host_copies(cp) as refused:
            try:
                gpu_model.compute_forces(gpu_data)
            except RuntimeError as err:
                errors.append(str(err))
            called.extend(refused)

    copies = _memcpys(guarded)
    error = "; ".join(errors)
    # device-to-device copies stay on the GPU; only host <-> device copies count
    across = [c for c in copies if "DtoH" in c[0] or "HtoD" in c[0]]
    bulk = [c for c in across if c[1] < 0 or c[1] > SCALAR_BYTES]
    rows.append(
        Row(
            name,
            "no host round trip",
            not bulk and not called and not error,
            f"{len(across)} host<->device memcpy "
            f"({', '.join(f'{n} {b} B' for n, b in across)})" + (f"; {error}" if error else ""),
        )
    )

    # LAMMPS writes rij on its own stream behind a busy kernel, then calls the model
    spin = _spin_kernel(cp)

    def late_write() -> float:
        right = gpu_state.rij.copy()
        gpu_state.rij[...] = right * 1.01  # stale values, finite and wrong
        torch.cuda.synchronize()
        with stream:
            spin((1,), (1,), (np.int64(200_000_000),))
            gpu_state.rij[...] = right
        gpu_model.compute_forces(gpu_data)
        torch.cuda.synchronize()
        return _relative(gpu_state.fij.get(), cpu_state.fij)

    late = late_write()  # torch on the legacy default stream: CUDA orders the two
    with torch.cuda.stream(torch.cuda.Stream()):  # torch elsewhere: the adapter waits
        late_side = late_write()
    rows.append(
        Row(
            name,
            "ordered after Kokkos's stream",
            max(late, late_side) <= tol,
            f"fij after a late write: {late:.1e} (torch on another stream: {late_side:.1e})",
        )
    )
    rows.append(
        Row(
            name,
            "time per call (info)",
            True,
            f"GPU {gpu_ms:.2f} ms, CPU {cpu_ms:.2f} ms, {arrays.npairs} pairs",
        )
    )
    return rows


def _mace_potential():
    """A small random MACE for Ar and Ne (tests/_mace_models.py), if mace-torch is
    importable."""
    from _mace_models import random_mace

    from nvalchemi_lammps.potentials.mace import Mace

    return Mace.from_model(random_mace(r_max=5.0, atomic_numbers=[18, 10]))


def _cases() -> list[tuple[str, object, bool, float]]:
    elements = ["Ar", "Ne"]
    lj = {
        "elements": elements,
        "epsilon": {"Ar": 0.0104, "Ne": 0.0031},
        "sigma": {"Ar": 3.40, "Ne": 2.75},
        "cutoff": 6.0,
    }
    return [
        ("lj", LennardJones(**lj), False, 1e-12),
        (
            "message_passing",
            MessagePassing(elements, cutoff=5.0, layers=3, features=16),
            True,
            1e-12,
        ),
        ("lj_float32", LennardJones(**lj, dtype="float32"), False, 1e-5),
    ]


@pytest.mark.parametrize("case", ["lj", "message_passing", "lj_float32", "mace"])
def test_mliap_door_on_the_gpu(cuda, case, tmp_path):
    cp = pytest.importorskip("cupy", reason="cupy is not importable (pip install cupy-cuda12x)")
    pytest.importorskip(
        "lammps.mliap",
        reason="LAMMPS's Python module is not importable (NVALCHEMI_LAMMPS_KOKKOS_CUDA=PREFIX "
        "puts PREFIX/python on the path)",
    )
    if case == "mace":
        # looked for, not imported: importing mace sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD for
        # the whole process (the package imports it without that, potentials/mace/)
        if importlib.util.find_spec("mace") is None:
            pytest.skip("mace-torch is not installed")
        name, potential, exchange, tol = "mace", _mace_potential(), True, 1e-12
    else:
        name, potential, exchange, tol = next(c for c in _cases() if c[0] == case)
    path = save_model(potential, tmp_path / f"{name}.pt")
    arrays, owner_row = periodic_rank(5, potential.spec.cutoff)
    rows = check_model(name, path, arrays, owner_row, exchange, tol, 10, cp)
    failed = [f"{r.check}: {r.detail}" for r in rows if not r.passed]
    assert failed == []
