"""What ``pair_style nvalchemi/kk``'s Python side costs per step beyond the model, without
LAMMPS: :func:`nvalchemi_lammps.frontends.kokkos.compute` on one rank's arrays laid out as
KOKKOS hands them over, against the bare model on the whole periodic system, in one
process, calls alternating.

The rank's rows are a random-MACE crystal's atoms then their periodic images within the
cutoff plus LAMMPS's skin (2 A in metal units), its pairs those within the cutoff (what the
pair style's Kokkos kernels hand over), its collectives ghost-row copies done by torch on
the arrays' device. Each call is timed to its end (a CUDA synchronization), the model and
the step in turns, ``--calls`` times after ``--warmup``; printed: the medians, the median of
the per-turn differences (the bridge's cost: the model's work on ghost rows, the exchanges,
the forces added into LAMMPS's array, the Python around them), the aten ops per call of
each. LAMMPS's own work in a step (the pair style's kernels, integration, position
communication, ~0.3-0.5 ms of host time on the H200 by ``kokkos_lammps.py bench
--profile``) comes on top.

    python benchmarks/kokkos_step_cost.py DIR --device cuda --atoms 864 19652

``--exchange comm``: the exchanges through the collectives (a stand-in for KOKKOS's, in
torch) instead of the owned rows the pair style hands over on one rank.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from bench_strategies import LATTICE, crystal
from torch.utils.dlpack import to_dlpack

from nvalchemi_lammps import LocalGraph, evaluate
from nvalchemi_lammps.engine import compile_potential
from nvalchemi_lammps.frontends.kokkos import KokkosStepRecord, compute
from nvalchemi_lammps.frontends.plugin import PluginSession
from nvalchemi_lammps.reference import neighbor_pairs

#: LAMMPS's default neighbor skin in metal units
SKIN = 2.0


class _CudaRows:
    """A CUDA array at an address, for ``torch.as_tensor`` (the CUDA array interface)."""

    def __init__(self, address: int, nrows: int, width: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nrows, width),
            "typestr": "<f8",
            "data": (address, False),
            "strides": None,
            "version": 3,
        }


class OneRankCollectives:
    """KOKKOS's collectives on one rank whose ghosts are images: ghost row ``r`` copies
    (forward) or adds into (reverse) row ``source[r]``, in torch on the rows' device."""

    def __init__(self, source: torch.Tensor, nlocal: int) -> None:
        self.ghosts, self.source, self.nlocal = source[nlocal:], source, nlocal

    def _rows(self, address: int, nrows: int, width: int) -> torch.Tensor:
        if self.source.is_cuda:
            return torch.as_tensor(_CudaRows(address, nrows, width), device=self.source.device)
        buffer = (ctypes.c_double * (nrows * width)).from_address(address)
        return torch.from_numpy(np.frombuffer(buffer, dtype=np.float64).reshape(nrows, width))

    def forward_exchange(self, address: int, nrows: int, width: int) -> None:
        rows = self._rows(address, nrows, width)
        rows[self.nlocal :] = rows.index_select(0, self.ghosts)

    def reverse_exchange(self, address: int, nrows: int, width: int) -> None:
        rows = self._rows(address, nrows, width)
        rows.index_add_(0, self.ghosts, rows[self.nlocal :].clone())
        rows[self.nlocal :] = 0.0

    def allreduce(self, values: memoryview) -> None:
        """One rank: the sum is the value."""


def rank_arrays(system: dict, cutoff: float, device: str) -> tuple[dict, int, int]:
    """One rank's arrays for the whole crystal: owned rows, then every periodic image within
    ``cutoff + SKIN`` of an owned atom (LAMMPS's ghosts); the pairs within ``cutoff``."""
    positions, cell, types = system["positions"], system["cell"], system["types"]
    nlocal = len(positions)
    pairs = neighbor_pairs(positions, cell, (True, True, True), cutoff + SKIN)
    image = np.any(pairs.shifts != 0, axis=1)
    keys = np.unique(np.column_stack([pairs.pair_j[image], pairs.shifts[image]]), axis=0)
    source = np.concatenate([np.arange(nlocal), keys[:, 0]])
    rows = np.concatenate([positions, positions[keys[:, 0]] + keys[:, 1:] @ cell])
    row_of = {tuple(k): nlocal + r for r, k in enumerate(keys.tolist())}
    neighbor_rows = np.where(
        image,
        [row_of.get((j, *s), -1) for j, s in zip(pairs.pair_j, pairs.shifts.tolist(), strict=True)],
        pairs.pair_j,
    )
    rij = rows[neighbor_rows] - rows[pairs.pair_i]
    inside = np.einsum("ij,ij->i", rij, rij) < cutoff * cutoff
    arrays = {
        "positions": torch.from_numpy(rows),
        "tags": torch.from_numpy(source.astype(np.int32) + 1),
        "species": torch.from_numpy(types[source].astype(np.int64) - 1),
        "pair_i": torch.from_numpy(pairs.pair_i[inside].astype(np.int64)),
        "pair_j": torch.from_numpy(neighbor_rows[inside].astype(np.int64)),
        "rij": torch.from_numpy(rij[inside]),
        "forces": torch.zeros((len(rows), 3), dtype=torch.float64),
        "source": torch.from_numpy(source),
    }
    return {k: v.to(device) for k, v in arrays.items()}, nlocal, len(rows)


def record(
    arrays: dict, nlocal: int, ntotal: int, cell: np.ndarray, collectives, gather: bool = True
):
    """The step as the pair style hands it over on one rank; ``gather``: with each row's
    owned row (its default there), else every exchange through ``collectives``."""
    capsules = {k: to_dlpack(arrays[k]) for k in arrays if k != "source"}
    return KokkosStepRecord(
        nlocal=nlocal,
        ntotal=ntotal,
        **capsules,
        atom_energies=None,
        atom_virials=None,
        pair_virial=False,
        charges=None,
        cell=tuple(float(v) for v in cell.reshape(-1)),
        periodic=(True, True, True),
        collectives=collectives,
        one_rank=True,
        owners=to_dlpack(arrays["source"]) if gather else None,
        send_rows=None,
        nrecv=0,
    )


def aten_ops(call) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        call()
    return sum(1 for e in profile.events() if e.name.startswith("aten::"))


def measure(
    model_file: Path,
    atoms: int,
    device: str,
    calls: int,
    warmup: int,
    mode: str = "no",
    gather: bool = True,
) -> dict:
    _, system = crystal(atoms, LATTICE["mace"], Path("/tmp") / f"cost{atoms}.data")
    session = PluginSession(str(model_file), 1, device)
    session.set_strategy("exchange")
    bare = session.potential if mode == "no" else compile_potential(session.potential, mode)
    session.set_compile(mode)
    cutoff = session.cutoff
    arrays, nlocal, ntotal = rank_arrays(system, cutoff, device)
    collectives = OneRankCollectives(arrays["source"], nlocal)
    pairs = neighbor_pairs(system["positions"], system["cell"], (True, True, True), cutoff)
    whole = [
        torch.as_tensor(system["types"] - 1, device=device),
        *(torch.from_numpy(a).to(device) for a in (pairs.pair_i, pairs.pair_j, pairs.rij)),
    ]
    potential = bare
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None

    def model() -> None:
        evaluate(potential, LocalGraph(nlocal, *whole))

    def step() -> None:
        arrays["forces"].zero_()  # LAMMPS clears its forces before the pair style
        compute(session, record(arrays, nlocal, ntotal, system["cell"], collectives, gather))

    times: dict[str, list[float]] = {"model": [], "step": []}
    for k in range(warmup + calls):
        for name, call in (
            (("model", model), ("step", step))
            if k % 2
            else (
                ("step", step),
                ("model", model),
            )
        ):
            sync()
            start = time.perf_counter()
            call()
            sync()
            if k >= warmup:
                times[name].append(1e3 * (time.perf_counter() - start))
    differences = [s - m for s, m in zip(times["step"], times["model"], strict=True)]
    return {
        "atoms": nlocal,
        "ghosts": ntotal - nlocal,
        "pairs": int(arrays["pair_i"].shape[0]),
        "model_ms": statistics.median(times["model"]),
        "step_ms": statistics.median(times["step"]),
        "bridge_ms": statistics.median(differences),
        "bridge_ms_quartiles": statistics.quantiles(differences, n=4),
        "model_aten_ops": aten_ops(model),
        "step_aten_ops": aten_ops(step),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="kokkos_lammps.py prepare's folder")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--atoms", type=int, nargs="+", default=[864, 19652])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--model", default="mace32_e3nn.pt")
    parser.add_argument(
        "--compile", default="no", help="a torch.compile mode for both (pair_style's compile)"
    )
    parser.add_argument(
        "--exchange",
        choices=["gather", "comm"],
        default="gather",
        help="one rank's exchanges by owned row (the pair style's default), or through the "
        "collectives (NVALCHEMI_LAMMPS_EXCHANGE=comm)",
    )
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # as a LAMMPS rank
    for atoms in args.atoms:
        row = measure(
            args.dir / args.model,
            atoms,
            args.device,
            args.calls,
            args.warmup,
            args.compile,
            args.exchange == "gather",
        )
        print(
            f"{row['atoms']:8d} atoms ({row['ghosts']} ghosts, {row['pairs']} pairs): "
            f"model {row['model_ms']:.2f} ms, step {row['step_ms']:.2f} ms, bridge "
            f"{row['bridge_ms']:.3f} ms (quartiles "
            f"{', '.join(f'{q:.3f}' for q in row['bridge_ms_quartiles'])}), aten ops "
            f"{row['step_aten_ops']} against {row['model_aten_ops']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
