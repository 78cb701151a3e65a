"""MACE on e3nn's kernels: the tensor products as e3nn generates them against the same
network with each input split once (nvalchemi_lammps/potentials/_tensor_product_splits.py).

For each model (``--models``, as bench_mace_cueq.py: ``test``, the tests' small MACE;
``mp-medium``, random weights of MACE-MP-0 medium's architecture) and size (``--atoms``,
fcc Cu with 0.08 A of jitter), our potential's forward and backward through the engine on
the whole periodic system, in one process: once as it loads (inputs split once) and once
with the network as mace-torch builds it (e3nn's generated code, the same weights), the
two called in turns, ``--calls`` each after three warm-up calls each, every call timed to
its end (a CUDA synchronization). Printed per row: the median ms of each, the median of the
per-turn ratios split / as generated, the aten ops per call of each (``torch.profiler``,
nested ones too), and whether the pair forces of the two are equal to the last bit, taken
with torch's deterministic kernels (on CUDA, MACE's sums over pairs use atomic adds whose
order changes from call to call: one network differs from itself by the printed run-to-run
relative difference without them).

    python benchmarks/bench_tensor_product_splits.py --device cuda --dtype float32 \\
        --models test mp-medium --atoms 864 19652 97556
    python benchmarks/bench_tensor_product_splits.py --device cpu --atoms 864 19652 --calls 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS deterministic, before CUDA
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_mace_cueq import CU_LATTICE, _copy_in, _sync, cu_crystal, our_call, random_model

from nvalchemi_lammps.potentials import mace as mace_module
from nvalchemi_lammps.potentials.mace import Mace
from nvalchemi_lammps.reference import neighbor_pairs


def potentials(name: str, dtype: str, device: str) -> dict[str, Mace]:
    """Our potential of model ``name`` on e3nn's kernels: as it loads, and with mace-torch's
    network (the same weights, e3nn's generated code)."""
    mace_module._mace()  # imported as the potential imports it, before e3nn
    model = random_model(name)
    split = Mace.from_model(model, dtype=dtype, kernels="e3nn")
    as_generated = Mace.from_model(model, dtype=dtype, kernels="e3nn")
    as_generated.model = mace_module._inference(_copy_in(model, split.spec.torch_dtype))
    return {"split": split.to(device), "as generated": as_generated.to(device)}


def aten_ops(call) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        call()
    return sum(1 for e in profile.events() if e.name.startswith("aten::"))


def pair_forces(run) -> np.ndarray:
    return run().pair_forces.detach().cpu().numpy()


def deterministic_pair_forces(runs: dict) -> dict[str, np.ndarray]:
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        return {key: pair_forces(run) for key, run in runs.items()}
    finally:
        torch.use_deterministic_algorithms(before)


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def measure(name: str, atoms: int, dtype: str, device: str, calls: int) -> dict:
    both = potentials(name, dtype, device)
    positions, cell = cu_crystal(atoms)
    cutoff = both["split"].spec.cutoff
    pairs = neighbor_pairs(positions, cell, (True, True, True), cutoff)
    runs = {k: our_call(p, atoms, pairs, device, species=0) for k, p in both.items()}
    forces = deterministic_pair_forces(runs)
    run_to_run = relative_difference(
        pair_forces(runs["as generated"]), pair_forces(runs["as generated"])
    )
    times: dict[str, list[float]] = {k: [] for k in runs}
    for turn in range(calls + 3):
        for key in runs if turn % 2 else reversed(runs):
            _sync(device)
            start = time.perf_counter()
            runs[key]()
            _sync(device)
            if turn >= 3:
                times[key].append(1e3 * (time.perf_counter() - start))
    ratios = [s / g for s, g in zip(times["split"], times["as generated"], strict=True)]
    return {
        "model": name,
        "atoms": atoms,
        "pairs": len(pairs.pair_i),
        "dtype": dtype,
        "device": device,
        "ms": {k: statistics.median(v) for k, v in times.items()},
        "samples": times,
        "split_over_generated": statistics.median(ratios),
        "aten_ops": {k: aten_ops(run) for k, run in runs.items()},
        "pair_forces_equal": bool(np.array_equal(forces["split"], forces["as generated"])),
        "relative_difference": relative_difference(forces["split"], forces["as generated"]),
        "run_to_run": run_to_run,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--models", nargs="+", default=["test"])
    parser.add_argument("--atoms", type=int, nargs="+", default=[864, 19652])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # as a LAMMPS rank
    rows = []
    for name in args.models:
        for atoms in args.atoms:
            row = measure(name, atoms, args.dtype, args.device, args.calls)
            rows.append(row)
            ms, ops = row["ms"], row["aten_ops"]
            print(
                f"{name:10s} {atoms:8d} atoms {row['pairs']:9d} pairs {args.dtype} "
                f"{args.device}: split {ms['split']:.2f} ms, as generated "
                f"{ms['as generated']:.2f} ms, ratio {row['split_over_generated']:.3f}; "
                f"aten ops {ops['split']} against {ops['as generated']}; pair forces "
                f"{'equal' if row['pair_forces_equal'] else 'DIFFERENT'} "
                f"({row['relative_difference']:.1e}; run to run {row['run_to_run']:.1e})",
                flush=True,
            )
            if args.json:
                args.json.write_text(json.dumps({"lattice": CU_LATTICE, "rows": rows}, indent=1))
    return 0 if all(r["pair_forces_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
