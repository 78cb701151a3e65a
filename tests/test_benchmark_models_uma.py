"""The UMA benchmark model (benchmarks/models.py: uma_s, uma_s_experts, merge_experts)
against fairchem-core's own evaluation, on water.

- experts merged for a composition (fairchem's ``merge_MOLE_model``) give what fairchem's
  mixture of experts gives on a system of that composition: fairchem's backbone forward
  with its own radius graph, and the predict unit on a fairchem checkpoint (normalization
  and element references included), atom by atom; on another composition they differ;
- uma-s-1p1's shape: the parameter counts, the model file against fairchem, and the
  configuration benchmarks/configs/uma_s.yaml building its model.

Needs fairchem-core (.venv-uma); the MACE models and the systems: test_benchmark_models.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from _systems import System, relative

from nvalchemi_lammps import load_model, save_model
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.uma

ROOT = Path(__file__).resolve().parents[1]
WATER = {"H": 2, "O": 1}


def _models():
    """benchmarks/models.py as a module (it is no package)."""
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "benchmarks/models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def water_box(side: int = 2, seed: int = 0) -> System:
    """side^3 water molecules (O-H 0.9572 A, H-O-H 104.52 degrees), randomly turned, on a
    cubic grid of 3.104 A (1 g/cm^3), rattled: a box shorter than twice UMA's cutoff (6 A),
    so atoms see their own images."""
    rng = np.random.default_rng(seed)
    angle = np.radians(104.52)
    molecule = 0.9572 * np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [np.cos(angle), 0, 0]])
    molecule[2, 1] = 0.9572 * np.sin(angle)
    positions = []
    for site in np.ndindex(side, side, side):
        q = rng.normal(size=4)
        w, x, y, z = q / np.linalg.norm(q)
        turn = np.array(
            [
                [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
            ]
        )
        positions += list(3.104 * np.array(site) + molecule @ turn.T)
    positions = np.array(positions) + rng.normal(scale=0.05, size=(3 * side**3, 3))
    species = np.tile([0, 1, 1], side**3)
    cell = np.eye(3) * 3.104 * side
    return System("water", positions, cell, (True, True, True), species, ("O", "H"))


def _evaluate(potential, system: System):
    return evaluate_reference(potential, system.positions, system.cell, system.pbc, system.species)


def _assert_equal(ours, theirs: dict, tol: float) -> None:
    diffs = {
        "energy": relative([ours.energy], [theirs["energy"]]),
        "forces": relative(ours.forces, theirs["forces"]),
    }
    assert all(d <= tol for d in diffs.values()), diffs
    assert np.abs(theirs["forces"]).max() > 1e-3  # forces that could be wrong


@pytest.fixture(scope="module")
def small_experts():
    """A small mixture of experts of uma-s-1p1's kind (tests/_uma_models.MOE_BACKBONE),
    float64, omol, spin 1."""
    from _uma_models import MOE_BACKBONE

    from nvalchemi_lammps.potentials.uma import Uma

    return Uma.random_weights(MOE_BACKBONE, ["O", "H"], "omol", seed=1, spin=1, dtype="float64")


def test_merged_experts_equal_fairchems_mixture(small_experts, tmp_path):
    """The merged model's file = fairchem's eSCNMDMoeBackbone forward (its experts mixed by
    the system's composition, its own radius graph) on water, to float64's rounding; a
    plain backbone, which sums over no ranks."""
    from _uma_models import fairchem_forward

    merged = _models().merge_experts(small_experts, WATER)
    assert type(merged.backbone).__name__ == "eSCNMDBackbone" and not merged.experts
    assert (merged.task, merged.spin) == ("omol", 1)
    system = water_box()
    ours = _evaluate(load_model(save_model(merged, tmp_path / "merged.pt")), system)
    _assert_equal(ours, fairchem_forward(small_experts, system), 1e-10)


def test_merged_experts_hold_for_their_composition_only(small_experts):
    """On a system of other proportions (one H made an O) fairchem mixes other experts:
    the merged model differs there (what the comparison above could catch)."""
    from _uma_models import fairchem_forward

    merged = _models().merge_experts(small_experts, WATER)
    base = water_box()
    species = base.species.copy()
    species[1] = 0
    other = System("water-O", base.positions, base.cell, base.pbc, species, base.elements)
    theirs = fairchem_forward(small_experts, other)
    assert relative(_evaluate(merged, other).forces, theirs["forces"]) > 1e-6


def test_merged_checkpoint_equals_predict_unit(tmp_path):
    """A fairchem checkpoint of uma-s-1p1's kind (one head for every dataset; normalizer
    and element references), read by Uma.from_checkpoint and merged for water = fairchem's
    predict unit (experts not merged) on water: energy and forces, atom by atom."""
    from _uma_models import fairchem_predict, predict_unit, write_moe_checkpoint

    from nvalchemi_lammps.potentials.uma import Uma

    path = write_moe_checkpoint(tmp_path / "uma.pt", seed=2, head="single")
    experts = Uma.from_checkpoint(path, "omol", elements=["O", "H"], spin=1, dtype="float64")
    merged = _models().merge_experts(experts, WATER)
    system = water_box(seed=3)
    ours = _evaluate(load_model(save_model(merged, tmp_path / "merged.pt")), system)
    _assert_equal(ours, fairchem_predict(predict_unit(path), system, "omol", 0, 1), 1e-10)


@pytest.mark.slow  # uma-s's 32 experts: 147 million parameters, built twice, a minute or more
def test_uma_s_of_the_released_shape_equals_fairchem(tmp_path):
    """uma-s-1p1's shape: its parameter counts (32 experts; merged: one backbone of its
    width and depth), the merged model's file in float64 = fairchem's mixture on water;
    the configuration's model (float32, as uma_s() makes it) within float32's rounding."""
    from _uma_models import fairchem_forward

    from nvalchemi_lammps.cli._bench_config import build_model, read_bench_config

    models = _models()
    experts = models.uma_s_experts(dtype="float64")
    assert sum(p.numel() for p in experts.parameters()) == 146_566_817
    assert experts.backbone.num_experts == 32 and experts.spec.cutoff == 6.0
    merged = models.merge_experts(experts, WATER)
    assert sum(p.numel() for p in merged.parameters()) == 6_349_825
    system = water_box(seed=4)
    ours = _evaluate(load_model(save_model(merged, tmp_path / "uma_s.pt")), system)
    _assert_equal(ours, fairchem_forward(experts, system), 1e-10)

    config = read_bench_config(ROOT / "benchmarks" / "configs" / "uma_s.yaml")
    single = build_model(config, tmp_path / "model.pt")
    assert single.spec.dtype == "float32" and single.spec.elements == ("O", "H")
    got = _evaluate(load_model(tmp_path / "model.pt"), system)
    assert relative(got.forces, ours.forces) <= 2e-5
    assert not np.array_equal(got.forces, ours.forces)
