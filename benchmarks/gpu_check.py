"""``pair_style nvalchemi ... device cuda`` against the CPU, through real LAMMPS runs.

For each model (Lennard-Jones argon; the 3-layer message-passing potential with ghost
exchange) and rank count: step-0 forces and energy with the model on the GPU equal the CPU
run by atom ID (float64), the multi-rank GPU run equals the one-rank GPU run, and the time
per MD step (median of the NVE loop over ``--repeats`` runs) is reported side by side.

    python benchmarks/gpu_check.py --cells 10 20 --ranks 1 2

Prints a table and writes ``gpu_check.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import torch

from nvalchemi_lammps import LennardJones, MessagePassing, save_model
from nvalchemi_lammps.lammps_run import read_dump, read_results, run_lammps, write_lammps_data

_LOOP = re.compile(r"^Loop time of (\S+) on \d+ procs for (\d+) steps", re.MULTILINE)
FCC = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
LATTICE = 5.26


def argon(cells: int, path: Path) -> Path:
    rng = np.random.default_rng(cells)
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 3)
    frac = (grid[:, None, :] + FCC[None]).reshape(-1, 3) / cells
    cell = np.eye(3) * cells * LATTICE
    positions = frac @ cell + rng.normal(0.0, 0.1, size=frac.shape)
    return write_lammps_data(path, positions, cell, np.ones(len(frac), dtype=int), [39.948])


def models(workdir: Path) -> dict[str, Path]:
    lj = LennardJones(["Ar"], {"Ar": 0.0104}, {"Ar": 3.40}, cutoff=8.5)
    mp = MessagePassing(["Ar"], cutoff=5.0, layers=3, features=16, seed=1)
    return {"lj": save_model(lj, workdir / "lj.pt"), "mpnn": save_model(mp, workdir / "mp.pt")}


def run(model: Path, data: Path, device: str, ranks: int, steps: int, workdir: Path) -> dict:
    script = textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        atom_modify map array
        read_data {data}
        pair_style nvalchemi {model} device {device}
        pair_coeff * * Ar
        velocity all create 60 4928459 loop geom
        dump d all custom 1 atoms.dump id fx fy fz
        dump_modify d sort id format float "%.17g"
        run 0
        print "RESULT pe $(pe:%.17g)"
        undump d
        fix nve all nve
        timestep 0.002
        thermo 100
        run 5
        run {steps}
        """
    )
    out = run_lammps(script, ranks, workdir, timeout=540).check()
    loops = _LOOP.findall(out.output)
    seconds, nsteps = float(loops[-1][0]), int(loops[-1][1])
    return {
        "dump": read_dump(workdir / "atoms.dump"),
        "pe": read_results(out.output)["pe"],
        "ms_per_step": 1e3 * seconds / nsteps,
    }


def rel(a: dict, b: dict) -> float:
    fa = np.stack([a["dump"][c] for c in ("fx", "fy", "fz")], 1)
    fb = np.stack([b["dump"][c] for c in ("fx", "fy", "fz")], 1)
    return float(np.abs(fa - fb).max() / np.abs(fb).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, nargs="+", default=[10])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = models(tmp)
        for cells in args.cells:
            data = argon(cells, tmp / f"argon{cells}.data")
            for name, model in paths.items():
                results = {}
                for ranks in args.ranks:
                    for device in ("cpu", "cuda"):
                        runs = [
                            run(
                                model,
                                data,
                                device,
                                ranks,
                                args.steps,
                                tmp / f"{name}-{cells}-{ranks}-{device}-{k}",
                            )
                            for k in range(args.repeats)
                        ]
                        runs[0]["ms_per_step"] = statistics.median(r["ms_per_step"] for r in runs)
                        results[ranks, device] = runs[0]
                base = results[args.ranks[0], "cuda"]
                for ranks in args.ranks:
                    cpu, gpu = results[ranks, "cpu"], results[ranks, "cuda"]
                    row = {
                        "model": name,
                        "atoms": 4 * cells**3,
                        "ranks": ranks,
                        "cpu_ms": cpu["ms_per_step"],
                        "gpu_ms": gpu["ms_per_step"],
                        "gpu_vs_cpu_force": rel(gpu, cpu),
                        "ranks_vs_1_force": rel(gpu, base),
                        "gpu_vs_cpu_energy": abs(gpu["pe"] - cpu["pe"]) / abs(cpu["pe"]),
                    }
                    failed |= (
                        max(
                            row["gpu_vs_cpu_force"],
                            row["ranks_vs_1_force"],
                            row["gpu_vs_cpu_energy"],
                        )
                        > 1e-10
                    )
                    rows.append(row)
    print(
        f"{'model':6} {'atoms':>7} {'ranks':>5} {'cpu ms/step':>12} {'gpu ms/step':>12} "
        f"{'dF gpu-cpu':>11} {'dF np-1':>9} {'dE gpu-cpu':>11}"
    )
    for r in rows:
        print(
            f"{r['model']:6} {r['atoms']:7d} {r['ranks']:5d} {r['cpu_ms']:12.2f} "
            f"{r['gpu_ms']:12.2f} {r['gpu_vs_cpu_force']:11.1e} {r['ranks_vs_1_force']:9.1e} "
            f"{r['gpu_vs_cpu_energy']:11.1e}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(
        json.dumps(
            {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows},
            indent=2,
        )
    )
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
