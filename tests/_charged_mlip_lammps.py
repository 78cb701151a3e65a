"""A machine-learned potential that takes the net charge (and spin and task) through
``pair_style nvalchemi`` on 1, 2 and 4 ranks, against the same model on the whole periodic
system without LAMMPS (``reference.py``): the runs and checks of ``test_lammps_aimnet2.py``
and ``test_lammps_uma.py``, with the model and its cases as parameters. (Two test modules:
aimnet and fairchem need different environments, see the Makefile.)

One LAMMPS run per rank count reads one data file (atom IDs 1..N) and evaluates each
:class:`Case` with ``run 0`` under ``strategy exchange``; the system has vacuum in the
upper half of its box along z: on 2 ranks (split along x) both own atoms, on 4 (split
along x and z) two own nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from _systems import System
from lammps_helpers import (
    NPROCS,
    TOLERANCE,
    assert_matches_reference,
    assert_ranks_own,
    assert_runs_agree,
    atoms_per_rank,
    read_evaluation,
    run0_evaluation,
    run0_header,
)

from nvalchemi_lammps.lammps_run import run_lammps, write_lammps_data
from nvalchemi_lammps.reference import evaluate_reference

PROCESSORS = {1: "", 2: "processors 2 1 1", 4: "processors 2 1 2"}
#: Rank counts against one rank, float32: the same float32 operations on other ranks.
FLOAT32_RANKS_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Case:
    """One ``run 0``: the model (``float64``, ``float32`` or another name of the models'
    files), the net charge and pair style keywords (``spin``, ``task``)."""

    name: str
    model: str
    charge: float
    keywords: dict = field(default_factory=dict)


def cases_script(data: Path, paths: dict[str, Path], nprocs: int, cases, elements) -> str:
    """``run 0`` of each case in one LAMMPS process: a dump and a print each."""
    lines = [run0_header(data.name, PROCESSORS[nprocs])]
    for case in cases:
        keywords = "".join(f" {k} {v}" for k, v in case.keywords.items())
        model = paths[case.model]
        lines.append(
            f"pair_style nvalchemi {model} strategy exchange charge {case.charge:g}{keywords}\n"
            f"pair_coeff * * {' '.join(elements)}\n"
        )
        lines.append(run0_evaluation(case.name))
    return "".join(lines)


def run_cases(tmp_path_factory, system: System, masses, paths, cases) -> dict:
    """Each rank count's run: ``{nprocs: ({case: (dump, printed results)}, output)}``."""
    results = {}
    for nprocs in NPROCS:
        workdir = tmp_path_factory.mktemp(f"np{nprocs}")
        data = write_lammps_data(
            workdir / "system.data", system.positions, system.cell, system.species + 1, masses
        )
        script = cases_script(data, paths, nprocs, cases, system.elements)
        run = run_lammps(script, nprocs, workdir, timeout=600)
        run.check()
        ids = np.arange(1, system.natoms + 1)
        found = {c.name: read_evaluation(workdir, run.output, c.name, ids) for c in cases}
        results[nprocs] = (found, run.output)
    return results


def assert_cases_equal_reference(
    model: str, potentials, run, nprocs: int, cases, system: System, float32_tolerance: float
) -> None:
    """Every case of one rank count's ``run`` (:func:`run_cases`) equals the reference: to
    :data:`TOLERANCE` in float64, to ``float32_tolerance`` for the ``float32`` model."""
    found, output = run
    owned = atoms_per_rank(output, "Nlocal")  # (fewest, most) per run 0
    assert len(owned) == len(cases)
    assert_ranks_own(owned, nprocs)
    for case in cases:
        ref = evaluate_reference(
            potentials[case.model],
            system.positions,
            system.cell,
            system.pbc,
            system.species,
            total_charge=case.charge,
            **case.keywords,
        )
        atoms, results = found[case.name]
        label = f"{model}/{case.name}/np{nprocs}"
        tol = float32_tolerance if case.model == "float32" else TOLERANCE
        assert_matches_reference(label, atoms, results, ref, system.cell, tol=tol)


def assert_ranks_equal_one_rank(model: str, runs, nprocs: int, case: str) -> None:
    """``case`` on ``nprocs`` ranks equals it on one to :data:`FLOAT32_RANKS_TOLERANCE`."""
    assert_runs_agree(
        f"{model}/{case}/np{nprocs}-vs-np1",
        runs[nprocs][0][case],
        runs[1][0][case],
        tol=FLOAT32_RANKS_TOLERANCE,
    )
