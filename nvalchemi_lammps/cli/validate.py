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
import json
import math
import re
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ._command import subcommand_main

if TYPE_CHECKING:
    from ..contract import Potential, Strategy
    from ..reference import ReferenceResult

HELP = "compare LAMMPS on several rank counts with the single-process reference"
#: Largest relative step-0 difference that passes, for float64 and float32 models.
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
#: After --steps N, trajectories on different rank counts part slowly (rounding differences
#: grow exponentially in any MD run); beyond this relative difference after a short run
#: (up to some hundred steps) something else differs.
MD_TOLERANCE = 1e-6
#: Random displacement of lattice atoms, as a fraction of the lattice constant.
DISPLACEMENT = 0.03
#: Temperature of the velocities for --steps (K), created with `velocity ... loop geom`,
#: so that every rank count starts from the same ones.
TEMPERATURE = 300.0
#: LAMMPS's default neighbor skin in metal and real units (length).
SKIN = 2.0
#: The receptive-field probe: one atom is moved this far (length) and every atom whose
#: energy changes by more than REACH_THRESHOLD x the largest change counts as reached, unless
#: that is below rounding: REACH_ROUNDING x the model's machine epsilon x the largest
#: per-atom energy (matrix products may round differently when the number of pairs changes).
REACH_DISPLACEMENT = 0.05
REACH_THRESHOLD = 1e-9
REACH_ROUNDING = 64.0
#: Width of the report's wrapped lines.
WIDTH = 100
#: Seconds one LAMMPS run may take.
RUN_TIMEOUT = 900.0

#: Fractional positions of the atoms of one conventional cubic cell.
LATTICES = {
    "sc": [[0.0, 0.0, 0.0]],
    "bcc": [[0.0, 0.0, 0.0], [0.5, 0.5, 0.5]],
    "fcc": [[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]],
    "diamond": [
        [0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0],
        [0.5, 0.0, 0.5],
        [0.0, 0.5, 0.5],
        [0.25, 0.25, 0.25],
        [0.75, 0.75, 0.25],
        [0.75, 0.25, 0.75],
        [0.25, 0.75, 0.75],
    ],
}

#: Unit labels per LAMMPS unit style: energy, force, pressure, velocity.
UNITS = {
    "metal": ("eV", "eV/A", "bar", "A/ps"),
    "real": ("kcal/mol", "kcal/mol/A", "atm", "A/fs"),
}
PRESSURE = ["pxx", "pyy", "pzz", "pxy", "pxz", "pyz"]
#: Columns of the step-0 dump, after `id`.
STEP0_COLUMNS = ["type", "x", "y", "z", "fx", "fy", "fz", "c_pe"] + [
    f"c_stress[{k}]" for k in range(1, 7)
]
#: Box of the run, printed after step 0: origin, lengths, tilts.
BOX = ["xlo", "ylo", "zlo", "lx", "ly", "lz", "xy", "xz", "yz"]
#: Names of the virial-pressure components in the printed results.
VIRIAL = [f"vir_{p}" for p in PRESSURE]


class UsageError(ValueError):
    """A command line that cannot be run (exit code 2)."""


# --- the structure ------------------------------------------------------------------------


@dataclass(frozen=True)
class Lattice:
    """``KIND:A:NXxNYxNZ`` of ``--lattice``."""

    kind: str
    constant: float
    cells: tuple[int, int, int]

    def __str__(self) -> str:
        return f"{self.kind} {self.constant:g} A, {'x'.join(map(str, self.cells))} cells"


def parse_lattice(text: str) -> Lattice:
    """``fcc:4.05:10x10x10`` (or ``fcc:4.05:10`` for 10x10x10) -> :class:`Lattice`.

    :raises UsageError: naming what is wrong and what is allowed
    """
    form = f"--lattice takes KIND:A:NXxNYxNZ (e.g. fcc:4.05:6x6x6), got '{text}'"
    parts = text.split(":")
    if len(parts) != 3:
        raise UsageError(form)
    kind, constant, cells = parts
    if kind not in LATTICES:
        raise UsageError(f"lattice kind must be one of {', '.join(LATTICES)}; got '{kind}'")
    try:
        a = float(constant)
        counts = [int(n) for n in cells.lower().split("x")]
    except ValueError:
        raise UsageError(form) from None
    if len(counts) == 1:
        counts *= 3
    if not a > 0.0 or len(counts) != 3 or min(counts) < 1:
        raise UsageError(form)
    return Lattice(kind, a, (counts[0], counts[1], counts[2]))


def build_lattice(
    lattice: Lattice, ntypes: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions (wrapped into the box), cell and LAMMPS types of a displaced crystal.

    Every atom moves by a normal random vector of ``DISPLACEMENT`` x the lattice constant
    per component (so that forces are not zero) and gets one of ``ntypes`` types at random;
    both are seeded.
    """
    rng = np.random.default_rng(seed)
    cells = np.array(lattice.cells)
    grid = np.stack(np.meshgrid(*(np.arange(n) for n in cells), indexing="ij"), -1)
    basis = np.array(LATTICES[lattice.kind])
    frac = (grid.reshape(-1, 1, 3) + basis[None]).reshape(-1, 3) / cells
    cell = np.diag(cells * lattice.constant).astype(np.float64)
    frac = frac + rng.normal(0.0, DISPLACEMENT, size=frac.shape) / cells
    positions = (frac % 1.0) @ cell
    types = rng.integers(1, ntypes + 1, size=len(frac))
    return positions, cell, types


def element_masses(elements: list[str], needed: bool) -> list[float]:
    """Mass of each element from ``ase.data``; 1.0 where unknown and not ``needed``
    (step 0 does not depend on masses)."""
    try:
        from ase.data import atomic_masses, atomic_numbers
    except ImportError:
        atomic_masses, atomic_numbers = None, {}
    masses = []
    for element in elements:
        if element in atomic_numbers:
            masses.append(float(atomic_masses[atomic_numbers[element]]))
        elif needed:
            why = "ase is not installed" if atomic_masses is None else "not a chemical symbol"
            raise UsageError(
                f"no mass for element {element} ({why}): --steps needs masses; "
                "give a data file with a Masses section (--data)"
            )
        else:
            masses.append(1.0)
    return masses


@dataclass(frozen=True)
class DataHeader:
    ntypes: int
    has_masses: bool
    atom_style: str


def read_data_header(path: Path) -> DataHeader:
    """Atom types, whether masses are given, and the atom style a LAMMPS data file names
    (``Atoms # charge``; atomic when it names none), read up to its Atoms section."""
    ntypes, has_masses, style = None, False, ""
    with open(path) as f:
        f.readline()  # the title line
        for line in f:
            text = line.split("#", 1)[0].strip()
            match = re.fullmatch(r"(\d+)\s+atom\s+types", text)
            if match:
                ntypes = int(match.group(1))
            elif text == "Masses":
                has_masses = True
            elif text == "Atoms":
                style = line.split("#", 1)[1].strip() if "#" in line else "atomic"
                break
        else:
            raise UsageError(f"data file {path} has no Atoms section")
    if ntypes is None:
        raise UsageError(f"data file {path} does not say how many atom types it has")
    return DataHeader(ntypes, has_masses, style or "atomic")


# --- what the model needs -------------------------------------------------------------------


def strategy_for(potential: Potential, asked: str) -> Strategy:
    """What ``pair_style nvalchemi ... strategy ASKED`` runs: the plugin's own rule
    (:func:`~nvalchemi_lammps.contract.resolve_strategy`), a usage error when refused."""
    from ..contract import resolve_strategy

    try:
        return resolve_strategy(potential.spec, asked, potential.name)
    except ValueError as err:
        raise UsageError(str(err)) from None


def describe_needs(potential: Potential, strategy: str, asked: str) -> list[tuple[str, str]]:
    """``(label, text)`` lines: the receptive field and how the strategy covers it."""
    spec = potential.spec
    rc, layers = spec.cutoff, spec.layers
    needs = (
        f"cutoff {rc:g} A, {layers} layer(s): receptive field (interaction_range) "
        f"{layers} x {rc:g} = {spec.interaction_range:g} A"
    )
    if strategy == "local":
        note = "" if asked == "auto" else f"; --strategy {asked} has no effect"
        text = (
            f"strictly local (1 layer): ghost shell of one cutoff ({rc:g} A), no collectives "
            f"of the model{note}"
        )
    elif strategy == "exchange":
        text = (
            f"exchange (supported: {', '.join(spec.strategies)}): ghost shell of one cutoff "
            f"({rc:g} A); per step {layers - 1} forward_exchange of ghost features (between "
            f"layers) and {layers - 1} reverse_exchange in the backward pass"
        )
    else:
        text = (
            f"shell (supported: {', '.join(spec.strategies)}): ghost shell of {layers} x "
            f"{rc:g} = {spec.interaction_range:g} A, ghost atoms get their own pairs; no "
            "collectives of the model"
        )
    return [("needs", needs), ("strategy", text)]


@dataclass(frozen=True)
class LogFacts:
    """What a run says about itself."""

    ghost_cutoff: float | None  # "ghost atom cutoff = X" of LAMMPS's neighbor list info
    strategy: str  # what the plugin's sessions reported (REPORT_ENV), "none" without a report


def read_log(output: str, reports: Path) -> LogFacts:
    """LAMMPS's ghost atom cutoff from its ``output``, and the strategy the plugin decided
    from the reports its sessions wrote into ``reports`` (every rank's, all the same)."""
    decided = {json.loads(f.read_text())["name"] for f in sorted(reports.glob("strategy-*.json"))}
    strategy = " / ".join(sorted(decided)) or "none"
    ghost = re.search(r"^\s*ghost atom cutoff = (\S+)", output, re.MULTILINE)
    return LogFacts(ghost_cutoff=float(ghost.group(1)) if ghost else None, strategy=strategy)


def min_image_distances(positions: np.ndarray, cell: np.ndarray, point: np.ndarray) -> np.ndarray:
    """Distance of every atom to the nearest periodic image of ``point``."""
    frac = (positions - point) @ np.linalg.inv(cell)
    frac -= np.round(frac)
    shifts = np.array(np.meshgrid([-1, 0, 1], [-1, 0, 1], [-1, 0, 1], indexing="ij"))
    shifts = shifts.reshape(3, -1).T
    vectors = (frac[:, None, :] + shifts[None]) @ cell
    return np.linalg.norm(vectors, axis=2).min(axis=1)


def measure_reach(
    potential: Potential,
    positions: np.ndarray,
    cell: np.ndarray,
    species: np.ndarray,
    reference: ReferenceResult,
) -> tuple[int, float]:
    """How far an atom's energy really reaches: moves the first mapped atom by
    ``REACH_DISPLACEMENT`` and returns (its index, the largest distance of an atom whose
    energy changed). A lower bound of the model's receptive field (also bounded by the
    box)."""
    import torch

    from ..reference import evaluate_reference

    atom = int(np.flatnonzero(species >= 0)[0])
    moved = positions.copy()
    moved[atom] += REACH_DISPLACEMENT * np.array([1.0, 2.0, 3.0]) / math.sqrt(14.0)
    after = evaluate_reference(potential, moved, cell, (True, True, True), species)
    change = np.abs(after.atom_energies - reference.atom_energies)
    epsilon = float(torch.finfo(potential.spec.torch_dtype).eps)
    rounding = REACH_ROUNDING * epsilon * float(np.abs(reference.atom_energies).max())
    reached = change > max(REACH_THRESHOLD * change.max(), rounding)
    if not reached.any():
        return atom, 0.0
    # an atom counts as close as it came to the moved one, before or after the move
    distances = np.minimum(
        min_image_distances(positions, cell, positions[atom]),
        min_image_distances(positions, cell, moved[atom]),
    )
    return atom, float(distances[reached].max())


# --- running LAMMPS -------------------------------------------------------------------------


def _quoted(path: Path) -> str:
    return f'"{path}"' if " " in str(path) else str(path)


def _print(tag: str, values: dict[str, str]) -> str:
    """``print`` of ``name value`` pairs at full precision, for ``read_results``."""
    fields = " ".join(f"{name} $({expr}:%.17g)" for name, expr in values.items())
    return f'print "{tag} {fields}"'


@dataclass(frozen=True)
class RunSetup:
    """Everything but the rank count that the LAMMPS input of every run shares."""

    data: Path
    model: Path
    units: str
    atom_style: str
    type_elements: list[str]
    masses: list[float] | None  # `mass` commands, when the data file has none
    strategy: str
    device: str
    steps: int
    seed: int
    compile: str = "no"


def lammps_script(setup: RunSetup) -> str:
    """Step 0 with per-atom dump, then optionally ``steps`` NVE steps."""
    virial = [f"c_virial[{k}]" for k in range(1, 7)]
    lines = [
        f"units {setup.units}",
        f"atom_style {setup.atom_style}",
        "atom_modify map array",
        "boundary p p p",
        f"read_data {_quoted(setup.data)}",
    ]
    lines += [f"mass {k + 1} {m!r}" for k, m in enumerate(setup.masses or [])]
    lines += [
        f"pair_style nvalchemi {_quoted(setup.model)} device {setup.device} "
        + f"strategy {setup.strategy} compile {setup.compile}",
        f"pair_coeff * * {' '.join(setup.type_elements)}",
        "compute pe all pe/atom",
        "compute stress all stress/atom NULL virial",
        "compute virial all pressure NULL virial",
        f"thermo_style custom step pe ke etotal {' '.join(virial)}",
        f"dump step0 all custom 1 step0.dump id {' '.join(STEP0_COLUMNS)}",
        'dump_modify step0 sort id format float "%.17g"',
        "run 0",
        "undump step0",
        _print("RESULT", {"pe": "pe", **{b: b for b in BOX}, **dict(zip(VIRIAL, virial))}),
    ]
    if setup.steps:
        lines += [
            f"velocity all create {TEMPERATURE:g} {setup.seed + 4928459} loop geom",
            "fix nve all nve",
            f"run {setup.steps}",
            "write_dump all custom final.dump id xu yu zu vx vy vz "
            + 'modify sort id format float "%.17g"',
            _print("FINAL", {"pe": "pe", "ke": "ke", "etotal": "etotal"}),
        ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class RankRun:
    ranks: int
    step0: dict[str, np.ndarray]
    results: dict[str, float]
    log: LogFacts
    final: dict[str, np.ndarray] | None
    final_results: dict[str, float]


def run_ranks(setup: RunSetup, ranks: int, workdir: Path) -> RankRun | str:
    """One LAMMPS run; a failed run returns its output tail instead."""
    from ..contract import REPORT_ENV
    from ..lammps_run import read_dump, read_results, run_lammps

    reports = workdir / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    env = {REPORT_ENV: str(reports)}
    run = run_lammps(lammps_script(setup), ranks, workdir, timeout=RUN_TIMEOUT, env=env)
    if run.returncode != 0 or not (workdir / "step0.dump").is_file():
        return run.output[-3000:]
    final = read_dump(workdir / "final.dump") if setup.steps else None
    return RankRun(
        ranks=ranks,
        step0=read_dump(workdir / "step0.dump"),
        results=read_results(run.output, "RESULT"),
        log=read_log(run.output, reports),
        final=final,
        final_results=read_results(run.output, "FINAL"),
    )


# --- comparing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One quantity at one rank count: ``relative = absolute / max|reference|``."""

    ranks: int
    quantity: str
    absolute: float
    relative: float
    worst_id: int | None

    def within(self, tolerance: float) -> bool:
        return self.relative <= tolerance  # False for NaN


def difference(
    ranks: int, quantity: str, got: np.ndarray, ref: np.ndarray, ids: np.ndarray | None
) -> Row:
    """The largest difference over all components; with ``ids`` (one per row), the ID of the
    row holding it."""
    got = np.asarray(got, dtype=np.float64).reshape(len(ref), -1)
    ref = np.asarray(ref, dtype=np.float64).reshape(len(ref), -1)
    diff = np.abs(got - ref)
    diff[~np.isfinite(got)] = np.inf
    absolute = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    relative = absolute / scale if scale > 0.0 else (0.0 if absolute == 0.0 else math.inf)
    worst = int(ids[int(np.argmax(diff.max(axis=1)))]) if ids is not None and diff.size else None
    return Row(ranks, quantity, absolute, relative, worst)


def step0_rows(run: RankRun, ref: ReferenceResult, volume: float, units: str) -> list[Row]:
    """The step-0 dump and results of one run against the reference (rows in ID order)."""
    from ..reference import NKTV2P

    energy, force, pressure, _ = UNITS[units]
    d, ids, n = run.step0, run.step0["id"], run.ranks
    virial = np.array([run.results.get(name, math.nan) for name in VIRIAL])
    ref_virial = ref.virial_voigt * NKTV2P[units] / volume
    stress = np.stack([d[f"c_stress[{k}]"] for k in range(1, 7)], axis=1)
    return [
        difference(n, f"energy [{energy}]", [run.results.get("pe", math.nan)], [ref.energy], None),
        difference(n, f"energy per atom [{energy}]", d["c_pe"], ref.atom_energies, ids),
        difference(
            n, f"forces [{force}]", np.stack([d["fx"], d["fy"], d["fz"]], 1), ref.forces, ids
        ),
        difference(n, f"virial pressure [{pressure}]", virial, ref_virial, None),
        difference(
            n,
            f"virial per atom [{pressure}*A^3]",
            stress,
            -NKTV2P[units] * ref.atom_virials,  # compute stress/atom, no velocities
            ids,
        ),
    ]


def md_rows(run: RankRun, first: RankRun, units: str) -> list[Row]:
    """The state after --steps of one run against the first rank count's."""
    energy, velocity = UNITS[units][0], UNITS[units][3]
    a, b, ids = run.final, first.final, first.final["id"]
    if not np.array_equal(a["id"], ids):
        return [Row(run.ranks, "atom IDs (atoms lost?)", math.inf, math.inf, None)]
    rows = [
        difference(
            run.ranks,
            "positions [A]",
            np.stack([a["xu"], a["yu"], a["zu"]], 1),
            np.stack([b["xu"], b["yu"], b["zu"]], 1),
            ids,
        ),
        difference(
            run.ranks,
            f"velocities [{velocity}]",
            np.stack([a["vx"], a["vy"], a["vz"]], 1),
            np.stack([b["vx"], b["vy"], b["vz"]], 1),
            ids,
        ),
    ]
    for key, label in (("pe", "potential energy"), ("etotal", "total energy")):
        got = run.final_results.get(key, math.nan)
        rows.append(
            difference(run.ranks, f"{label} [{energy}]", [got], [first.final_results[key]], None)
        )
    return rows


def format_table(rows: list[Row], tolerance: float) -> list[str]:
    head = f"{'ranks':>5}  {'quantity':34}{'max |diff|':>12}{'max rel':>11}  worst atom ID"
    lines = [head, "-" * len(head)]
    for row in rows:
        worst = "-" if row.worst_id is None else str(row.worst_id)
        flag = "" if row.within(tolerance) else "   <-- beyond tolerance"
        lines.append(
            f"{row.ranks:>5}  {row.quantity:34}{row.absolute:>12.2e}{row.relative:>11.2e}"
            f"  {worst:>13}{flag}"
        )
    return lines


# --- what to change -------------------------------------------------------------------------


def advice(
    potential: Potential,
    decision: Strategy,
    reach: float,
    failing: list[Row],
    logs: dict[int, LogFacts],
    tolerance: float,
) -> list[str]:
    """What is wrong and what to change, most specific first."""
    spec = potential.spec
    rc, layers = spec.cutoff, spec.layers
    problems = []
    if reach > spec.interaction_range * (1.0 + 1e-12):
        true_layers = max(layers + 1, math.ceil(reach / rc - 1e-9))
        fix = (
            f"declare layers={true_layers} (or more) in its spec (ModelSpec.layers), so that "
            "pair_style nvalchemi exchanges ghost features or widens the ghost shell"
        )
        if layers > 1 and "shell" in spec.strategies:
            fix += (
                f"; or run it with strategy shell and comm_modify cutoff "
                f"{true_layers * rc + SKIN:g} (layers x cutoff + the neighbor skin)"
            )
        else:
            fix += (
                f" (with layers={layers} the pair style treats it as strictly local: ghost "
                "atoms get no pairs and no exchanged features, whatever the ghost cutoff)"
            )
        problems.append(
            f"the model's energies depend on atoms at least {reach:.3g} A away, beyond its "
            f"declared receptive field cutoff x layers = {rc:g} x {layers} = "
            f"{spec.interaction_range:g} A: {fix}"
        )
    strategy, needed = decision.name, decision.ghost_cutoff
    for ranks, log in sorted(logs.items()):
        if log.strategy != strategy:
            problems.append(
                f"on {ranks} rank(s) the pair style ran strategy {log.strategy}, where "
                f"{strategy} was expected from the model's spec: the installed plugin does not "
                "match this nvalchemi_lammps (reinstall the package)"
            )
        if log.ghost_cutoff is not None and not log.ghost_cutoff > needed:
            problems.append(
                f"on {ranks} rank(s) LAMMPS's ghost atom cutoff is {log.ghost_cutoff:g} A, "
                f"not beyond the {needed:g} A that strategy {strategy} needs: add "
                f"comm_modify cutoff {needed + SKIN:g} to the input"
            )
    if failing and not problems:
        ranks = sorted({row.ranks for row in failing})
        where = f"at {', '.join(map(str, ranks))} rank(s)"
        if spec.dtype == "float32" and min(r.relative for r in failing) < 1e-4:
            problems.append(
                f"the model computes in float32, whose rounding differs between rank counts "
                f"({where}): pass a looser --tolerance (1e-5 is the default for float32)"
            )
        elif strategy == "exchange":
            problems.append(
                f"with strategy exchange the numbers differ {where}: the model's forward must "
                "call graph.comm.forward_exchange on the node features before every layer "
                "after the first (ghost rows are stale otherwise); try --strategy shell, or "
                'declare strategies=("shell",) in its spec if it cannot exchange'
            )
        elif strategy == "shell":
            problems.append(
                f"with strategy shell the numbers differ {where}: the model must compute ghost "
                "atoms' features from their own pairs (pair_i holds ghost receivers too) and "
                "must not assume that receivers are owned; try --strategy exchange"
            )
        else:
            problems.append(
                f"the numbers of this strictly local model differ {where}: an atom's energy "
                "may use only its pairs within the cutoff (graph.pair_i/pair_j/rij); sums "
                "over all atoms need graph.comm.allreduce; if it passes messages, declare "
                "its layers in its spec (ModelSpec.layers)"
            )
    return problems


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
    """The data file and what every run shares; raises UsageError."""
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
        potential = load_model(args.model)
        decision = strategy_for(potential, args.strategy)
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
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        setup = _prepare(args, potential, workdir)
    except (UsageError, OSError) as err:
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
