"""LAMMPS runs of a model file on N ranks: the input script (step 0 with a per-atom dump,
then optionally NVE steps), the run, and what it reports about itself."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Temperature of the velocities for --steps (K), created with `velocity ... loop geom`,
#: so that every rank count starts from the same ones.
TEMPERATURE = 300.0
#: Seconds one LAMMPS run may take.
RUN_TIMEOUT = 900.0
PRESSURE = ["pxx", "pyy", "pzz", "pxy", "pxz", "pyz"]
#: Columns of the step-0 dump, after `id`.
STEP0_COLUMNS = ["type", "x", "y", "z", "fx", "fy", "fz", "c_pe"] + [
    f"c_stress[{k}]" for k in range(1, 7)
]
#: Box of the run, printed after step 0: origin, lengths, tilts.
BOX = ["xlo", "ylo", "zlo", "lx", "ly", "lz", "xy", "xz", "yz"]
#: Names of the virial-pressure components in the printed results.
VIRIAL = [f"vir_{p}" for p in PRESSURE]


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
