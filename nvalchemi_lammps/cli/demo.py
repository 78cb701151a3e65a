"""Run argon through pair_style nvalchemi and through LAMMPS's own lj/cut, side by side.

Writes the built-in argon model (Lennard-Jones, epsilon 0.0104 eV, sigma 3.40 A, cutoff
8.5 A), then runs the input lammps_inputs/in.argon under `mpirun -np RANKS lmp` twice: an
fcc crystal with random displacements, step 0, velocities for 100 K, NVT, then NVE. It
prints LAMMPS's thermo output of both runs and a table comparing them. The exit code is 1
when step-0 energy, pressure or forces (compared per atom ID) differ by more than 1e-10
relative, or a run fails.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._command import UsageError, add_switch, subcommand_main, working_folder

HELP = "run argon with pair_style nvalchemi and with lj/cut under mpirun and compare"
#: Largest relative difference of step-0 energy, pressure and forces that passes.
TOLERANCE = 1e-10
#: The input, in lammps_inputs/ (installed as nvalchemi_lammps/lammps_inputs/).
INPUT = "in.argon"
MODEL = "argon.pt"
#: pair style name in the input (its `pair` variable) -> label in the report
STYLES = {"nvalchemi": "pair_style nvalchemi", "lj/cut": "pair_style lj/cut"}
#: atoms per fcc unit cell
ATOMS_PER_CELL = 4


def lammps_input(name: str) -> Path:
    """Path of a ready LAMMPS input: in the installed package, else in the source tree."""
    package = Path(__file__).resolve().parent.parent
    for folder in (package / "lammps_inputs", package.parent / "lammps_inputs"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"LAMMPS input {name} not found in {package}/lammps_inputs")


@dataclass(frozen=True)
class StyleRun:
    """One finished run of the input with one pair style."""

    style: str
    workdir: Path
    results: dict[str, float]
    forces: dict[str, np.ndarray]
    thermo: list[str]
    wall: float


def thermo_blocks(output: str) -> list[str]:
    """The thermo tables of a LAMMPS screen output, header and rows, with loop times."""
    lines, inside = [], False
    for line in output.splitlines():
        if line.split()[:1] == ["Step"]:
            inside = True
        if inside:
            lines.append(line)
        if line.startswith("Loop time of"):
            inside = False
    return lines


def _variables(values: dict[str, object]) -> str:
    """`variable NAME index VALUE` lines; put first, they win over the input's own
    defaults exactly as `-var NAME VALUE` on the command line does."""
    return "".join(f"variable {name} index {value}\n" for name, value in values.items())


def run_style(
    script: str, style: str, workdir: Path, ranks: int, variables: dict[str, object]
) -> StyleRun | str:
    """Run the input ``script`` with ``style``; a failed run returns LAMMPS's output tail
    instead."""
    from ..lammps_run import read_dump, read_results, run_lammps

    script = _variables({"pair": style, **variables}) + script
    start = time.perf_counter()
    run = run_lammps(script, ranks, workdir, timeout=600.0)
    wall = time.perf_counter() - start
    if run.returncode != 0:
        return run.output[-3000:]
    return StyleRun(
        style=style,
        workdir=workdir,
        results=read_results(run.output),
        forces=read_dump(workdir / "forces_step0.dump"),
        thermo=thermo_blocks(run.output),
        wall=wall,
    )


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


def compare(runs: list[StyleRun]) -> tuple[list[str], bool]:
    """The side-by-side table of two runs and whether step 0 agrees within TOLERANCE."""
    a, b = runs
    ra, rb = a.results, b.results
    natoms = int(ra["atoms"])
    width = 24
    head = f"{'':34}{STYLES[a.style]:>{width}}{STYLES[b.style]:>{width}}{'|diff|':>11}{'rel':>10}"
    lines = [head, "-" * len(head)]

    def row(label: str, x: float, y: float) -> float:
        rel = _relative(x, y)
        lines.append(f"{label:34}{x:>{width}.15g}{y:>{width}.15g}{abs(x - y):>11.2e}{rel:>10.2e}")
        return rel

    lines.append(f"step 0 ({natoms} atoms, displaced fcc)")
    worst = {
        "energy": row("  potential energy [eV]", ra["step0_pe"], rb["step0_pe"]),
        "pressure": row("  pressure, virial only [bar]", ra["step0_press"], rb["step0_press"]),
    }
    fa, fb = a.forces, b.forces
    if not np.array_equal(fa["id"], fb["id"]):
        lines.append("  forces: the two runs dumped different atom IDs")
        worst["forces"] = math.inf
    else:
        force_a = np.stack([fa["fx"], fa["fy"], fa["fz"]], axis=1)
        force_b = np.stack([fb["fx"], fb["fy"], fb["fz"]], axis=1)
        diff = np.abs(force_a - force_b)
        worst_atom = int(fa["id"][np.argmax(diff.max(axis=1))])
        scale = float(np.abs(force_b).max())
        worst["forces"] = float(diff.max()) / max(scale, 1e-300)
        lines.append(
            f"  {'forces [eV/A], per atom ID':32}{'max |F| ' + format(scale, '.6g'):>{2 * width}}"
            f"{diff.max():>11.2e}{worst['forces']:>10.2e}"
        )
        lines.append(f"    (largest difference on atom {worst_atom}; rel = max|dF| / max|F|)")
    lines.append(f"after {int(ra['nvt_steps'])} NVT + {int(ra['nve_steps'])} NVE steps")
    for key, label in (
        ("final_pe", "  potential energy [eV]"),
        ("final_ke", "  kinetic energy [eV]"),
        ("final_etotal", "  total energy [eV]"),
        ("final_press", "  pressure [bar]"),
        ("final_temp", "  temperature [K]"),
    ):
        row(label, ra[key], rb[key])
    duration = ra["nve_steps"] * ra["dt"]
    drift = [1e3 * (r["final_etotal"] - r["nve_start_etotal"]) / natoms for r in (ra, rb)]
    lines.append(
        f"{'NVE drift [meV/atom over ' + format(duration, 'g') + ' ps]':34}"
        f"{drift[0]:>{width}.3g}{drift[1]:>{width}.3g}"
    )
    lines.append(f"{'wall time of the run [s]':34}{a.wall:>{width}.1f}{b.wall:>{width}.1f}")
    lines.append("(trajectories part slowly: rounding differences grow in any MD run)")
    ok = all(value <= TOLERANCE for value in worst.values())
    verdict = ", ".join(f"{k} {v:.1e}" for k, v in worst.items())
    lines.append(
        ("PASS" if ok else "FAIL")
        + f": step-0 relative differences {verdict} (tolerance {TOLERANCE:g})"
    )
    return lines, ok


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=2, help="MPI ranks (default 2)")
    parser.add_argument(
        "--atoms",
        type=int,
        default=2048,
        help="about this many atoms, rounded to 4 n^3 (default 2048: 8x8x8 fcc cells)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=200,
        help="NVT steps, and as many NVE steps after them (default 200, 2 fs each)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep model, inputs, logs and dumps here (default: a temporary folder)",
    )
    add_switch(
        parser, "--reference", "also run LAMMPS's own pair_style lj/cut and compare (default: yes)"
    )


def _demo(args: argparse.Namespace, workdir: Path) -> int:
    from .._model_file import save_model
    from .export import default_config_text, potential_from_config

    try:
        script_path = lammps_input(INPUT)
    except FileNotFoundError as err:
        print(f"error: {err}")
        return 1
    cells = max(4, round((args.atoms / ATOMS_PER_CELL) ** (1.0 / 3.0)))
    natoms = ATOMS_PER_CELL * cells**3
    workdir.mkdir(parents=True, exist_ok=True)
    potential = potential_from_config(tomllib.loads(default_config_text()))
    save_model(potential, workdir / MODEL)
    print(
        f"nvalchemi-lammps demo: {natoms} argon atoms (fcc {cells}x{cells}x{cells}), "
        f"{args.ranks} MPI rank(s), {args.steps} NVT + {args.steps} NVE steps"
    )
    print(
        f"model {workdir / MODEL}: {potential.name}, cutoff {potential.spec.cutoff:g} A, "
        f"units {potential.spec.units}"
    )
    print(f"input {script_path}; runs in {workdir}")
    variables = {
        "model": f"../{MODEL}",
        "cells": cells,
        "nvt_steps": args.steps,
        "nve_steps": args.steps,
    }
    runs = []
    for style in STYLES if args.reference else ["nvalchemi"]:
        folder = workdir / style.replace("/", "_")
        print(
            f"\n=== {STYLES[style]}: mpirun -np {args.ranks} lmp -in {INPUT} "
            + " ".join(f"-var {k} {v}" for k, v in {"pair": style, **variables}.items())
            + f"   (in {folder})"
        )
        result = run_style(script_path.read_text(), style, folder, args.ranks, variables)
        if isinstance(result, str):
            print(result)
            print(f"error: LAMMPS failed with {STYLES[style]}; its log is {folder}/log.lammps")
            if style == "nvalchemi":
                print("`nvalchemi-lammps info` tells whether pair_style nvalchemi is installed")
            return 1
        print("\n".join(result.thermo))
        runs.append(result)
    if not args.reference:
        return 0
    print()
    lines, ok = compare(runs)
    print("\n".join(lines))
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    if args.ranks < 1 or args.atoms < 1 or args.steps < 1:
        print("error: --ranks, --atoms and --steps must be positive")
        return 2
    if args.workdir is not None:
        try:
            working_folder(args.workdir, "--workdir")
        except UsageError as err:
            print(f"error: {err}")
            return 2
        return _demo(args, args.workdir)
    with tempfile.TemporaryDirectory(prefix="nvalchemi-demo-") as tmp:
        return _demo(args, Path(tmp))


def main(argv: list[str] | None = None) -> int:
    """``nvalchemi-lammps demo``; returns the exit code."""
    return subcommand_main(sys.modules[__name__], "demo", argv)
