"""Check a model file through LAMMPS on several MPI rank counts against the single-process
reference, before a long run.

For each rank count, runs `mpirun -np N lmp` with pair_style nvalchemi on one structure (a
displaced crystal built here with --lattice, or your own data file with --data), and
compares step 0 per atom ID with the same model evaluated on the whole periodic system
without LAMMPS: potential energy, per-atom energy, forces, the virial (the virial part of
the pressure tensor) and the per-atom virial. It prints what the model needs (cutoff,
layers, receptive field = layers x cutoff, the strategy and its collectives), the ghost
cutoff LAMMPS used (from its log), how far an atom's energy really reaches (measured by
displacing one atom), and a table of the largest absolute and relative differences with the
worst atom ID. With --steps N it also runs N NVE steps from the same velocities on every
rank count and compares the final state across rank counts.

The exit code is 0 when every step-0 difference is within the tolerance, 1 when one is
not (the report says what to change) or LAMMPS fails, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..lammps_run import TEMPERATURE, RankRun, RunSetup, run_ranks
from ..receptive_field import REACH_DISPLACEMENT, measure_reach
from ..structures import (
    LATTICES,
    build_lattice,
    element_masses,
    parse_lattice,
    read_data_header,
)
from ._command import UsageError, positive, subcommand_main, working_folder
from ._comparison import (
    MD_TOLERANCE,
    TOLERANCE,
    Row,
    advice,
    describe_needs,
    format_table,
    md_rows,
    step0_rows,
    strategy_for,
)

if TYPE_CHECKING:
    from ..contract import Potential
    from ..reference import ReferenceResult

HELP = "compare LAMMPS on several rank counts with the single-process reference"
#: Width of the report's wrapped lines.
WIDTH = 100


# --- the command ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, metavar="MODEL.pt", help="the model file")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--lattice",
        metavar="KIND:A:NXxNYxNZ",
        help=f"build a displaced crystal: KIND one of {', '.join(LATTICES)}, lattice "
        "constant A (Angstrom), cells per direction (e.g. fcc:4.05:6x6x6)",
    )
    source.add_argument(
        "--data",
        type=Path,
        metavar="FILE.data",
        help="a LAMMPS data file (periodic in x, y and z) instead of a built crystal",
    )
    parser.add_argument(
        "--elements",
        nargs="+",
        metavar="EL",
        help="with --lattice: which of the model's elements fill the crystal (default: all); "
        "with --data: the element of atom type 1, 2, ... (NULL to leave a type out; "
        "default: the model's elements in order, when there are as many as types)",
    )
    parser.add_argument(
        "--ranks",
        default="1,2,4",
        metavar="N,N,...",
        help="MPI rank counts to run (default 1,2,4)",
    )
    parser.add_argument(
        "--strategy",
        choices=["auto", "exchange", "shell"],
        default="auto",
        help="pair_style nvalchemi strategy for message-passing models (default auto)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="REL",
        help="largest relative difference that passes (default 1e-10 for float64 models, "
        "1e-5 for float32)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=0,
        metavar="N",
        help=f"also run N NVE steps from the same velocities ({TEMPERATURE:g} K) on every "
        "rank count and compare the final state across rank counts (default 0)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="pair_style nvalchemi device: cpu, cuda, cuda:N (default cpu)",
    )
    parser.add_argument(
        "--compile",
        default="no",
        metavar="MODE",
        help="pair_style nvalchemi compile: no, yes or a torch.compile mode (default no)",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of displacements, species, velocities (default 1)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep data file, inputs, logs and dumps here (default: a temporary folder)",
    )


def _rank_counts(text: str) -> list[int]:
    try:
        counts = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UsageError(f"--ranks takes positive rank counts like 1,2,4; got '{text}'")
    return sorted(set(counts))


def _prepare(args: argparse.Namespace, potential: Potential, workdir: Path) -> RunSetup:
    """The data file and what every run shares; raises ValueError (UsageError among them)."""
    spec = potential.spec
    model_elements = list(spec.elements)
    if args.lattice is not None:
        lattice = parse_lattice(args.lattice)
        elements = list(args.elements or model_elements)
        unknown = [e for e in elements if e not in model_elements]
        if unknown or len(set(elements)) != len(elements):
            raise UsageError(
                f"--elements must name distinct elements of the model "
                f"({', '.join(model_elements)}); got {' '.join(elements)}"
            )
        from ..lammps_run import write_lammps_data

        positions, cell, types = build_lattice(lattice, len(elements), args.seed)
        data = write_lammps_data(
            workdir / "system.data",
            positions,
            cell,
            types,
            element_masses(elements, needed=args.steps > 0),
        )
        _say(
            "system",
            f"{lattice}: {len(positions)} atoms of {' '.join(elements)} (random, seed "
            f"{args.seed}), written to {data}",
        )
        type_elements, masses, atom_style = elements, None, "atomic"
    else:
        data = args.data.resolve()
        if not data.is_file():
            raise UsageError(f"data file {args.data} not found")
        header = read_data_header(data)
        if args.elements:
            type_elements = list(args.elements)
        elif header.ntypes == len(model_elements):
            type_elements = model_elements
        else:
            raise UsageError(
                f"data file {args.data} has {header.ntypes} atom types and the model "
                f"{len(model_elements)} elements ({', '.join(model_elements)}): name the "
                "element of each type with --elements"
            )
        if len(type_elements) != header.ntypes:
            raise UsageError(
                f"--elements names {len(type_elements)} elements for the {header.ntypes} "
                f"atom types of {args.data}"
            )
        from .._elements import map_elements

        try:
            map_elements(type_elements, model_elements)
        except ValueError as err:
            raise UsageError(f"--elements: {err}") from None
        masses = None
        if not header.has_masses:
            masses = element_masses(type_elements, needed=args.steps > 0)
        atom_style = header.atom_style
        types = ", ".join(f"{k + 1}={e}" for k, e in enumerate(type_elements))
        _say("system", f"{data} (types {types})")
    return RunSetup(
        data=Path(data).resolve(),
        model=args.model.resolve(),
        units=spec.units,
        atom_style=atom_style,
        type_elements=type_elements,
        masses=masses,
        strategy=args.strategy,
        device=args.device,
        steps=args.steps,
        seed=args.seed,
        compile=args.compile,
    )


def _say(label: str, text: str) -> None:
    """``label`` in a column of 10, ``text`` wrapped under it."""
    print(_wrap(text, f"{label:10}"))


def _wrap(text: str, first: str) -> str:
    indent = " " * len(first)
    return textwrap.fill(
        text,
        WIDTH,
        initial_indent=first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _reference(
    potential: Potential, setup: RunSetup, first: RankRun
) -> tuple[ReferenceResult, np.ndarray, np.ndarray, np.ndarray]:
    """The reference on exactly the atoms LAMMPS read (wrapped into its box, by ID), and
    those positions, cell and species."""
    from .._elements import map_elements
    from ..reference import evaluate_reference

    box, d = first.results, first.step0
    origin = np.array([box["xlo"], box["ylo"], box["zlo"]])
    cell = np.array(
        [[box["lx"], 0.0, 0.0], [box["xy"], box["ly"], 0.0], [box["xz"], box["yz"], box["lz"]]]
    )
    positions = np.stack([d["x"], d["y"], d["z"]], axis=1) - origin
    elements = potential.spec.elements
    type_species = np.array(map_elements(setup.type_elements, elements), dtype=np.int64)
    species = type_species[d["type"].astype(np.int64) - 1]
    reference = evaluate_reference(potential, positions, cell, (True, True, True), species)
    return reference, positions, cell, species


def _validate(args: argparse.Namespace, workdir: Path) -> int:
    from .._model_file import ModelFileError, load_model

    try:
        ranks = _rank_counts(args.ranks)
        if args.steps < 0:
            raise UsageError(f"--steps must be 0 or more, got {args.steps}")
        if args.seed < 0:
            raise UsageError(f"--seed must be 0 or more, got {args.seed}")
        if args.tolerance is not None:
            positive(args.tolerance, "--tolerance")
        potential = load_model(args.model)
        decision = strategy_for(potential, args.strategy)
        working_folder(workdir, "--workdir")
    except (ModelFileError, UsageError) as err:
        print(f"error: {err}")
        return 2
    spec = potential.spec
    tolerance = args.tolerance if args.tolerance is not None else TOLERANCE[spec.dtype]
    _say(
        "model",
        f"{args.model}: {potential.name}, elements {' '.join(spec.elements)}, "
        f"units {spec.units}, {spec.dtype}",
    )
    for label, text in describe_needs(potential, decision.name, args.strategy):
        _say(label, text)
    try:
        setup = _prepare(args, potential, workdir)
    except (ValueError, OSError) as err:  # UsageError, and what the tools refuse
        print(f"error: {err}")
        return 2

    runs: dict[int, RankRun] = {}
    for n in ranks:
        folder = workdir / f"np{n}"
        result = run_ranks(setup, n, folder)
        if isinstance(result, str):
            print(result)
            print(f"error: LAMMPS failed on {n} rank(s); its input and log are in {folder}")
            return 1
        runs[n] = result
    first = runs[ranks[0]]
    reference, positions, cell, species = _reference(potential, setup, first)
    atom, reach = measure_reach(potential, positions, cell, species, reference)
    _say(
        "reach",
        f"moving atom ID {int(first.step0['id'][atom])} by {REACH_DISPLACEMENT:g} A changes "
        f"the energies of atoms up to {reach:.3g} A away (a lower bound of the receptive "
        f"field; declared: {spec.interaction_range:g} A)",
    )

    needed = decision.ghost_cutoff
    print(f"\nLAMMPS    {'ranks':>5}  {'ghost atom cutoff':>18}  {'needed':>8}  strategy run")
    for n, run in runs.items():
        ghost = "not in log" if run.log.ghost_cutoff is None else f"{run.log.ghost_cutoff:g} A"
        print(f"          {n:>5}  {ghost:>18}  {needed:>6g} A  {run.log.strategy}")

    volume = abs(float(np.linalg.det(cell)))
    rows: list[Row] = []
    for n, run in runs.items():
        same = np.array_equal(run.step0["id"], first.step0["id"]) and np.array_equal(
            run.step0["x"], first.step0["x"]
        )
        if not same:
            rows.append(Row(n, "atom IDs / positions read", math.inf, math.inf, None))
        else:
            rows += step0_rows(run, reference, volume, spec.units)
    print(
        f"\nstep 0, {len(positions)} atoms: pair_style nvalchemi on N ranks against the "
        "single-process reference,\nper atom ID (rel = max|diff| / max|reference|)"
    )
    print("\n".join(format_table(rows, tolerance)))
    failing = [row for row in rows if not row.within(tolerance)]
    logs = {n: run.log for n, run in runs.items()}
    problems = advice(potential, decision, reach, failing, logs, tolerance)

    md_checked = args.steps > 0 and len(ranks) > 1
    if args.steps:
        md = [row for n in ranks[1:] for row in md_rows(runs[n], first, spec.units)]
        print(
            f"\nafter {args.steps} NVE steps from the same velocities, against {ranks[0]} "
            "rank(s)\n(rounding differences grow slowly in any MD run)"
        )
        print("\n".join(format_table(md, MD_TOLERANCE)) if md else "  (one rank count only)")
        if any(not row.within(MD_TOLERANCE) for row in md) and not problems:
            problems.append(
                f"step 0 agrees but after {args.steps} steps the rank counts differ beyond "
                f"{MD_TOLERANCE:g} relative: fewer --steps tell whether this is the "
                "exponential growth of rounding differences that every MD run shows, or a "
                "real difference"
            )

    print()
    for problem in problems:
        print(_wrap(problem, "PROBLEM: "))
    counts = ", ".join(map(str, ranks))
    if not failing and not problems:
        after = f"; after {args.steps} steps within {MD_TOLERANCE:g}" if md_checked else ""
        print(
            f"PASS: every step-0 quantity within {tolerance:g} relative at {counts} rank(s)" + after
        )
        return 0
    worst = max(failing, key=lambda r: r.relative, default=None)
    detail = (
        f"largest step-0 difference {worst.relative:.2e} relative ({worst.quantity}, "
        f"{worst.ranks} rank(s))"
        if worst
        else "see above"
    )
    print(f"FAIL: {detail}; tolerance {tolerance:g}")
    if args.workdir is None:
        print("(--workdir DIR keeps the inputs, logs and dumps)")
    return 1


def run(args: argparse.Namespace) -> int:
    if args.workdir is not None:
        return _validate(args, args.workdir.resolve())
    with tempfile.TemporaryDirectory(prefix="nvalchemi-validate-") as tmp:
        return _validate(args, Path(tmp))


def main(argv: list[str] | None = None) -> int:
    """``nvalchemi-lammps validate``; returns the exit code."""
    return subcommand_main(sys.modules[__name__], "validate", argv)
