"""Machine-learned potentials that take the net charge (and spin and task), with the model
as a parameter: NULL atoms and net charges the model refuses (without LAMMPS), then through
``pair_style nvalchemi`` on 1, 2 and 4 ranks, against the same model on the whole periodic
system without LAMMPS (``reference.py``): ``aimnet2``
(``test_aimnet2.py`` checks the reference against aimnet's own forward) and ``uma``
(``test_uma.py``: against fairchem's). The UMA cases are marked ``uma``: fairchem-core runs
in an environment of its own (``.venv-uma``, see the Makefile, which runs this module in both).

One LAMMPS run per model and rank count reads one data file (atom IDs 1..N) and evaluates
each :class:`Case` with ``run 0`` under ``strategy exchange``. Each system has vacuum in
the upper half of its box along z: on 2 ranks (split along x) both own atoms; on 4 (split
along x and z) two own nothing.

- aimnet2, 31 atoms of small H/C/N/O molecules: the float64 model neutral, the float64
  model with ``charge -1`` (which must change the energy), and the float32 model with
  ``charge -1``;
- uma, 16 atoms of H, C, O and Cu: the float64 model neutral (task omat), the float64 model
  with ``charge -1`` (task omol, spin multiplicity 2, charge and spin channel balancing: an
  all-reduce per block), the same with ``charge 1 spin 3 task omat`` from the pair style,
  and the float32 model of the first with ``charge -1``.

Checks:

- float64: energy, per-atom energy, forces by atom ID, pressure tensor and per-atom virial
  equal the reference to 1e-10 relative;
- float32: the same within the model's ``float32_tolerance`` of the float32 reference (the
  reference runs the same float32 arithmetic, in another summation order), and 2 and 4
  ranks equal 1 rank to 1e-6.

The predicted charges' sum over ranks is checked in ``test_aimnet2.py`` (LAMMPS has no
per-atom output for them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _aimnet2_models import molecular_box, molecules_vacuum, random_aimnet2
from _systems import BAD_TOTAL_CHARGES, System, assert_null_atom_left_out, in_float32
from _uma_models import BALANCED_BACKBONE, copper_oxide_box, copper_oxide_slab, random_uma
from lammps_helpers import (
    NPROCS,
    SPLIT_XZ,
    TOLERANCE,
    assert_matches_reference,
    assert_ranks_own,
    assert_runs_agree,
    atoms_per_rank,
    read_evaluation,
    run0_evaluation,
    run0_header,
)

from nvalchemi_lammps import save_model
from nvalchemi_lammps.lammps_run import run_lammps, write_lammps_data
from nvalchemi_lammps.reference import evaluate_reference
from nvalchemi_lammps.structures import element_masses

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


@dataclass(frozen=True)
class ChargedModel:
    """A model under test: its system, how to build its variants, its cases."""

    system: Any  # System, built lazily
    potentials: Any  # () -> {variant: potential}
    cases: list[Case]
    #: float32 LAMMPS run vs the float32 reference: the same float32 operations summed in
    #: another order
    float32_tolerance: float
    #: two cases whose energies must differ (the charge reaches the model), or None
    charge_changes: tuple[str, str] | None = None


def _aimnet2_models() -> dict:
    double = random_aimnet2(seed=0, dtype="float64")
    return {"float64": double, "float32": in_float32(double)}


def _uma_models() -> dict:
    double = random_uma(seed=0, dtype="float64")
    balanced = random_uma(seed=1, backbone=BALANCED_BACKBONE, task="omol", spin=2)
    return {"float64": double, "float32": in_float32(double), "balanced": balanced}


AIMNET2_CASES = [
    Case("f64_neutral", "float64", 0.0),
    Case("f64_anion", "float64", -1.0),
    Case("f32_anion", "float32", -1.0),
]
UMA_CASES = [
    Case("f64_neutral", "float64", 0.0),
    Case("f64_balanced_anion", "balanced", -1.0),
    # the input script's spin and task instead of the model's own (omol, 2)
    Case("f64_balanced_cation", "balanced", 1.0, {"spin": 3, "task": "omat"}),
    Case("f32_anion", "float32", -1.0),
]
MODELS = {
    # float32: measured 2e-9 (energy) to 7e-7 (forces, virial) (neighbor sums, index_add
    # over pairs, the all-reduce); an error of the function shows up at 1e-4 (test_aimnet2.py)
    "aimnet2": ChargedModel(
        molecules_vacuum, _aimnet2_models, AIMNET2_CASES, 1e-5, ("f64_neutral", "f64_anion")
    ),
    # float32: measured at most 3.6e-7 (forces; energy 1.6e-8) (edge messages scattered to
    # atoms, the exchange); a change of the function moves the forces by 1e-1 (test_uma.py)
    "uma": ChargedModel(copper_oxide_slab, _uma_models, UMA_CASES, 1e-5),
}


def cases_script(data: Path, paths: dict[str, Path], nprocs: int, cases, elements) -> str:
    """``run 0`` of each case in one LAMMPS process: a dump and a print each."""
    lines = [run0_header(data.name, SPLIT_XZ[nprocs])]
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


def _unit_models(name: str) -> tuple[dict, System]:
    """The unit tests' models (``plain``, and ``coupled``: one whose atoms are coupled
    through the total charge) and system."""
    if name == "aimnet2":
        potential = random_aimnet2(seed=0)  # charge equilibration couples every atom
        return {"plain": potential, "coupled": potential}, molecular_box()
    # charge and spin channel balancing: a sum over the whole system per block
    balanced = random_uma(seed=1, backbone=BALANCED_BACKBONE, task="omol", spin=3)
    return {"plain": random_uma(seed=0), "coupled": balanced}, copper_oxide_box()


MODEL_NAMES = [pytest.param("aimnet2"), pytest.param("uma", marks=pytest.mark.uma)]


@pytest.fixture(scope="module", params=MODEL_NAMES)
def unit_model(request):
    return _unit_models(request.param)


def test_null_atoms_are_left_out(unit_model):
    """An atom of a NULL type takes part in nothing, the coupling through the total charge
    included (AIMNet2's charge equilibration, UMA's channel balancing)."""
    potentials, system = unit_model
    assert_null_atom_left_out(potentials["coupled"], system)


@pytest.mark.parametrize(("charge", "message"), BAD_TOTAL_CHARGES)
def test_bad_total_charge(unit_model, charge, message):
    potentials, system = unit_model
    with pytest.raises(ValueError, match=re.escape(message)):
        evaluate_reference(
            potentials["plain"],
            system.positions,
            system.cell,
            system.pbc,
            system.species,
            total_charge=charge,
        )


@pytest.fixture(scope="module", params=MODEL_NAMES)
def charged(request, tmp_path_factory):
    """One model's name, its definition, potentials, system and runs (:func:`run_cases`)."""
    name = request.param
    model = MODELS[name]
    system = model.system()
    potentials = model.potentials()
    workdir = tmp_path_factory.mktemp(name)
    paths = {k: save_model(p, workdir / f"{name}_{k}.pt") for k, p in potentials.items()}
    masses = element_masses(list(system.elements), True)
    runs = run_cases(tmp_path_factory, system, masses, paths, model.cases)
    return name, model, potentials, system, runs


@pytest.mark.lammps
@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_charged_model_equals_reference(charged, nprocs):
    name, model, potentials, system, runs = charged
    if model.charge_changes:  # the net charge reaches the model through pair_style ... charge
        cases = runs[nprocs][0]
        first, second = (cases[c][1]["pe"] for c in model.charge_changes)
        assert abs(second - first) > 1e-6 * abs(first), (first, second)
    assert_cases_equal_reference(
        name, potentials, runs[nprocs], nprocs, model.cases, system, model.float32_tolerance
    )


@pytest.mark.lammps
@pytest.mark.parametrize("nprocs", NPROCS[1:], ids=[f"np{n}" for n in NPROCS[1:]])
def test_charged_model_float32_ranks_equal_one_rank(charged, nprocs):
    name, _, _, _, runs = charged
    assert_ranks_equal_one_rank(name, runs, nprocs, "f32_anion")
