"""``nvalchemi-lammps bench``'s rows: one per size, rank count and style, from what the
ranks of its LAMMPS process measured; the table and the plot."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from pathlib import Path

from ._bench_config import NS_PER_TIME_UNIT, TIMESTEP, BenchConfig, Style


@dataclass
class Row:
    atoms: int
    ranks: int
    style: str
    ms_per_step: float
    cpu_ms_per_step: float  # CPU time of the busiest rank's process per step
    atom_steps_per_s: float
    ns_per_day: float
    model_ms: float | None  # the bare model on the whole system (1 rank)
    step_over_model: float | None
    fixed_ms: float | None  # step - model: what a step costs beyond the model
    graphed_ms: float | None  # the bare model captured as CUDA graphs (on a GPU)
    over_graphed_ms: float | None  # step - graphed model
    # this project's sessions: the step split (None for other styles)
    lammps_ms: float | None
    bridge_ms: float | None
    inside_model_ms: float | None
    collectives_ms: float | None
    peak_host_mib: float
    peak_gpu_mib: float | None
    force_difference: float  # max|F - F_first ranks| / max|F_first ranks|, step 0, by atom ID
    force_vs_first_style: float  # the same against the first style at these ranks
    over_first: float = 1.0  # median over the rounds of ms/step over the first style's
    compiled: int | None = None  # graphs compiled during the timed steps, any rank
    eager: str | None = None  # why captured terms run eagerly after all (rank 0's session)
    rounds_ms: list[float] | None = None  # ms/step of each round (slowest rank)
    # the potential energy after each round's timed steps: every turn starts from the same
    # positions and velocities, so the same in every round
    rounds_pe: list[float] | None = None


def _relative(forces: dict, reference: dict) -> float:
    import numpy as np

    columns = ("fx", "fy", "fz")
    got = np.stack([forces[c] for c in columns], axis=1)
    want = np.stack([reference[c] for c in columns], axis=1)
    if got.shape != want.shape or not (forces["id"] == reference["id"]).all():
        return float("inf")
    scale = float(np.abs(want).max()) or 1.0
    return float(np.abs(got - want).max()) / scale


def row(
    config: BenchConfig, style: Style, k: int, atoms: int, ranks: int, out: dict, first: list
) -> Row:
    """Style ``k``'s row of one process's ``out``; ``first``: the step-0 forces of the
    first rank count."""

    def per_step(key: str, style: int = k) -> list[float]:
        # the slowest rank of each round
        mine = [[r for r in rank["runs"] if r["style"] == style] for rank in out["ranks"]]
        by_round = zip(*mine, strict=True)  # per round: every rank's record
        return [1e3 * max(r.get(key, 0.0) for r in rnd) / config.steps for rnd in by_round]

    by_round = list(zip(*[[r for r in rank["runs"] if r["style"] == k] for rank in out["ranks"]]))
    step_ms = per_step("seconds")
    first_ms = per_step("seconds", 0)
    step = statistics.median(step_ms)
    timed = "plugin" in by_round[0][0]
    split = {}
    if timed:
        plugin, model, collectives = (
            statistics.median(per_step(key)) for key in ("plugin", "model", "collectives")
        )
        split = {
            "lammps_ms": step - plugin,
            "bridge_ms": plugin - model,
            "inside_model_ms": model - collectives,
            "collectives_ms": collectives,
        }
    bare = out["ranks"][0]["bare_ms"]
    model_ms = ratio = fixed = None
    if bare:
        rounds = [r["round"] for r in out["ranks"][0]["runs"] if r["style"] == k]
        around = [(a + b) / 2 for a, b in itertools.pairwise(bare)]
        per_round = [(s, around[t]) for s, t in zip(step_ms, rounds, strict=True)]
        model_ms = statistics.median(bare)
        ratio = statistics.median(s / m for s, m in per_round)
        fixed = statistics.median(s - m for s, m in per_round)
    graphed = out["ranks"][0].get("graphed_ms") or []
    graphed_ms = over_graphed = None
    if graphed:
        around = [(a + b) / 2 for a, b in itertools.pairwise(graphed)]
        rounds = [r["round"] for r in out["ranks"][0]["runs"] if r["style"] == k]
        graphed_ms = statistics.median(graphed)
        over_graphed = statistics.median(s - around[t] for s, t in zip(step_ms, rounds))
    gpu = [r["peak_gpu_mib"] for rnd in by_round for r in rnd if "peak_gpu_mib" in r]
    compiled = [r["compiled"] for rnd in by_round for r in rnd if "compiled" in r]
    dt = config.timestep or TIMESTEP[config.units]
    return Row(
        atoms=atoms,
        ranks=ranks,
        style=style.name,
        ms_per_step=step,
        cpu_ms_per_step=statistics.median(per_step("cpu_seconds")),
        atom_steps_per_s=atoms / (step * 1e-3),
        ns_per_day=dt * NS_PER_TIME_UNIT[config.units] * 86400.0 / (step * 1e-3),
        model_ms=model_ms,
        step_over_model=ratio,
        fixed_ms=fixed,
        graphed_ms=graphed_ms,
        over_graphed_ms=over_graphed,
        lammps_ms=split.get("lammps_ms"),
        bridge_ms=split.get("bridge_ms"),
        inside_model_ms=split.get("inside_model_ms"),
        collectives_ms=split.get("collectives_ms"),
        peak_host_mib=max(rank["peak_host_mib"] for rank in out["ranks"]),
        peak_gpu_mib=max(gpu) if gpu else None,
        force_difference=_relative(out["step0"][k], first[k]),
        force_vs_first_style=_relative(out["step0"][k], out["step0"][0]),
        over_first=statistics.median(s / f for s, f in zip(step_ms, first_ms, strict=True)),
        compiled=max(compiled) if compiled else None,
        eager=next((r["eager"] for rnd in by_round for r in rnd if "eager" in r), None),
        rounds_ms=step_ms,
        rounds_pe=[r["pe"] for r in out["ranks"][0]["runs"] if r["style"] == k],
    )


def _cell(value: float | None, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def _compiled(r: Row) -> str:
    return "eager" if r.eager else "-" if r.compiled is None else str(r.compiled)


def format_rows(rows: list[Row]) -> list[str]:
    """The table; on a GPU, the bare model captured as CUDA graphs (``graphed``) and what a
    step costs beyond it (``step-grf``); with a compiled model, a last column of the graphs
    compiled during the timed steps (0 when the capacities of the first steps held), or
    ``eager`` where a captured model runs eagerly after all (the reason in the JSON)."""
    compiling = any(r.compiled is not None for r in rows)
    graphed = any(r.graphed_ms is not None for r in rows)
    width = max([len("style")] + [len(r.style) for r in rows])
    header = (
        f"{'atoms':>8} {'ranks':>5} {'style':<{width}} {'ms/step':>9} {'cpu ms':>8} {'/1st':>6} "
        f"{'ns/day':>8} {'model':>8} {'step/mdl':>8} {'step-mdl':>8} {'lammps':>7} {'bridge':>7} "
        f"{'in-model':>8} {'collect.':>8} {'MiB':>6} {'dF(ranks)':>9} {'dF(1st)':>8}"
        + (f" {'graphed':>8} {'step-grf':>8}" if graphed else "")
        + (f" {'compiled':>8}" if compiling else "")
    )
    lines = [header]
    for r in rows:
        memory = r.peak_gpu_mib if r.peak_gpu_mib is not None else r.peak_host_mib
        lines.append(
            f"{r.atoms:>8} {r.ranks:>5} {r.style:<{width}} {r.ms_per_step:>9.3f} "
            f"{r.cpu_ms_per_step:>8.3f} {r.over_first:>6.2f} "
            f"{r.ns_per_day:>8.4g} {_cell(r.model_ms, 8, '.3f')} "
            f"{_cell(r.step_over_model, 8, '.2f')} {_cell(r.fixed_ms, 8, '.3f')} "
            f"{_cell(r.lammps_ms, 7, '.2f')} {_cell(r.bridge_ms, 7, '.2f')} "
            f"{_cell(r.inside_model_ms, 8, '.2f')} {_cell(r.collectives_ms, 8, '.2f')} "
            f"{memory:>6.0f} {r.force_difference:>9.1e} {r.force_vs_first_style:>8.1e}"
            + (
                f" {_cell(r.graphed_ms, 8, '.3f')} {_cell(r.over_graphed_ms, 8, '.3f')}"
                if graphed
                else ""
            )
            + (f" {_compiled(r):>8}" if compiling else "")
        )
    return lines


def plot(rows: list[Row], title: str, path: Path) -> None:
    """ns/day against atoms (what users choose a style by), one line per style and rank
    count, the bare model (eager, and on a GPU captured) dashed: the speed of a step that
    cost only the model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for style, ranks in sorted({(r.style, r.ranks) for r in rows}):
        mine = sorted(
            (r for r in rows if (r.style, r.ranks) == (style, ranks)), key=lambda r: r.atoms
        )
        ax.plot(
            [r.atoms for r in mine], [r.ns_per_day for r in mine], "o-", label=f"{style} ({ranks})"
        )
    for field, line, label in (("model_ms", "k--", "bare model"), ("graphed_ms", "k:", "graphed")):
        # ns/day scales as 1 / ms: the row's own ns/day times its ms/step over the model's
        models = {
            r.atoms: r.ns_per_day * r.ms_per_step / getattr(r, field)
            for r in rows
            if getattr(r, field)
        }
        if models:
            atoms = sorted(models)
            ax.plot(atoms, [models[a] for a in atoms], line, label=label)
    ax.set(xscale="log", yscale="log", xlabel="atoms", ylabel="ns / day", title=title)
    ax.legend(title="style (ranks)", fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
