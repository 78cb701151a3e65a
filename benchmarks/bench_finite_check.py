"""What the every-step check for non-finite energies and forces costs (issue 17).

The engine reads one sum per gradient together with the energy, in the host sync the energy
needs anyway (``_energy_and_finite`` in ``nvalchemi_lammps/engine/_evaluate.py``). This
runs ``lammps_inputs/in.argon`` through ``pair_style nvalchemi`` with the check and with
the engine's previous energy read (``float(owned.sum())``, patched in through a
``sitecustomize`` in LAMMPS's embedded Python), alternating, and reports the median ms per
step (LAMMPS's Loop time) and Pair ms per step of each; and, in this process, the check
alone on a gradient of the size the run has.

    python benchmarks/bench_finite_check.py                  # 4000 atoms, 1 rank, 7 repeats
    python benchmarks/bench_finite_check.py --cells 6 --repeats 1 --steps 10   # smoke run
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import timeit
from pathlib import Path

import torch

from nvalchemi_lammps.engine._evaluate import _energy_and_finite
from nvalchemi_lammps.lammps_run import run_lammps

ROOT = Path(__file__).resolve().parent.parent

#: The engine's energy read before the check, for the "without" runs.
_UNCHECKED = """\
import sys

if sys.argv in ([], [""]):
    from nvalchemi_lammps.engine import _evaluate

    _evaluate._energy_and_finite = lambda owned, grads: (float(owned.sum()), True)
"""


def _run(workdir: Path, model: Path, args, checked: bool) -> tuple[float, float]:
    site = workdir / ("site-checked" if checked else "site-unchecked")
    site.mkdir(exist_ok=True)
    if not checked:
        (site / "sitecustomize.py").write_text(_UNCHECKED)
    script = (ROOT / "lammps_inputs" / "in.argon").read_text()
    variables = {
        "model": model,
        "cells": args.cells,
        "nvt_steps": 10,
        "nve_steps": args.steps,
        "thermo": args.steps,
    }
    header = "".join(f"variable {k} index {v}\n" for k, v in variables.items())
    run = run_lammps(header + script, args.ranks, workdir, env={"PYTHONPATH": str(site)}).check()
    loops = re.findall(
        r"^Loop time of (\S+) on \d+ procs for (\d+) steps", run.output, re.MULTILINE
    )
    pairs = re.findall(r"^Pair\s+\|\s+\S+\s+\|\s+(\S+)", run.output, re.MULTILINE)
    cpu = re.findall(r"^(\S+)% CPU use", run.output, re.MULTILINE)
    seconds, steps = float(loops[-1][0]), int(loops[-1][1])
    # on a shared machine the CPU time per step scatters less than the wall time
    return (
        1e3 * seconds / steps,
        1e3 * float(pairs[-1]) / steps,
        1e3 * seconds * float(cpu[-1]) / 100 / steps,
    )


def _check_alone(npairs: int, natoms: int) -> tuple[float, float]:
    """ms of the check's energy read and of the previous one, on tensors of this size."""
    torch.set_num_threads(1)  # as the plugin runs, one thread per rank
    owned = torch.rand(natoms, dtype=torch.float64)
    grads = [torch.rand(npairs, 3, dtype=torch.float64)]
    number = 200
    checked = timeit.timeit(lambda: _energy_and_finite(owned, grads), number=number)
    previous = timeit.timeit(lambda: float(owned.sum()), number=number)
    return 1e3 * checked / number, 1e3 * previous / number


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=10, help="fcc cells per side (4 n^3 atoms)")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = _default_model(workdir)
        times: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
        for _ in range(args.repeats):
            for checked in (True, False):
                times[checked].append(_run(workdir, model, args, checked))
    natoms = 4 * args.cells**3
    print(
        f"argon fcc, {natoms} atoms, {args.ranks} rank(s), {args.steps} NVE steps, "
        f"median of {args.repeats} (torch {torch.__version__}, {torch.get_num_threads()} threads here)"
    )
    for checked in (True, False):
        step, pair, cpu = (statistics.median(t[k] for t in times[checked]) for k in range(3))
        label = "with the check" if checked else "without"
        print(
            f"  {label:15s} {step:8.3f} ms/step   Pair {pair:8.3f} ms/step   CPU {cpu:8.3f} ms/step"
        )
    npairs = natoms * 75 // args.ranks  # argon within 8.5 A: ~75 neighbors per atom
    alone, previous = _check_alone(npairs, natoms // args.ranks)
    print(
        f"  the check alone on {npairs} pairs: {alone:.3f} ms (previous energy read {previous:.3f} ms)"
    )


def _default_model(workdir: Path) -> Path:
    from nvalchemi_lammps.cli.export import main as export

    path = workdir / "argon.pt"
    export(["--default", "-o", str(path), "--no-check"])
    return path


if __name__ == "__main__":
    main()
