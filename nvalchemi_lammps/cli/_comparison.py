"""``validate``'s judgement: what the model needs, how each rank count compares with the
single-process reference, and what to change when they differ."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..lammps_run import VIRIAL, LogFacts, RankRun
from ._command import UsageError

if TYPE_CHECKING:
    from ..contract import Potential, Strategy
    from ..reference import ReferenceResult

#: Largest relative step-0 difference that passes, for float64 and float32 models.
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
#: After --steps N, trajectories on different rank counts part slowly (rounding differences
#: grow exponentially in any MD run); beyond this relative difference after a short run
#: (up to some hundred steps) something else differs.
MD_TOLERANCE = 1e-6
#: LAMMPS's default neighbor skin in metal and real units (length).
SKIN = 2.0
#: Unit labels per LAMMPS unit style: energy, force, pressure, velocity.
UNITS = {
    "metal": ("eV", "eV/A", "bar", "A/ps"),
    "real": ("kcal/mol", "kcal/mol/A", "atm", "A/fs"),
}


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
