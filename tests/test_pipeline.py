"""A pipeline is the sum of its terms: against each term evaluated on its own, and its spec,
model file and configuration errors."""

from __future__ import annotations

import numpy as np
import pytest
from _pipeline_terms import ewald, lennard_jones, message_passing, system, terms

from nvalchemi_lammps import MessagePassing, Pipeline, load_model, save_model
from nvalchemi_lammps.reference import evaluate_reference


def test_pipeline_is_the_sum_of_its_terms():
    positions, cell, species = system()
    pbc = (True, True, True)
    parts = [evaluate_reference(t, positions, cell, pbc, species) for t in terms()]
    whole = evaluate_reference(Pipeline(terms()), positions, cell, pbc, species)
    total = sum(p.energy for p in parts)
    assert whole.energy == pytest.approx(total, rel=1e-13, abs=0.0)
    np.testing.assert_allclose(
        whole.atom_energies, sum(p.atom_energies for p in parts), rtol=0, atol=1e-13
    )
    np.testing.assert_allclose(whole.forces, sum(p.forces for p in parts), rtol=0, atol=1e-13)
    np.testing.assert_allclose(whole.virial, sum(p.virial for p in parts), rtol=0, atol=1e-12)


def test_each_term_computes_in_its_own_dtype():
    """A float32 message-passing term inside a float64 pipeline gives what it gives alone,
    up to float32 rounding (its pairs come in another order, so its sums round otherwise)."""
    positions, cell, species = system()
    pbc = (True, True, True)
    mp32 = message_passing("float32")
    pipeline = Pipeline([lennard_jones(), mp32])
    assert pipeline.spec.dtype == "float64"
    lj_alone = evaluate_reference(lennard_jones(), positions, cell, pbc, species)
    mp_alone = evaluate_reference(mp32, positions, cell, pbc, species)
    whole = evaluate_reference(pipeline, positions, cell, pbc, species)
    expected = lj_alone.forces + mp_alone.forces
    scale = np.abs(mp_alone.forces).max()
    np.testing.assert_allclose(whole.forces, expected, rtol=0, atol=1e-6 * scale)
    # and it really is computed in float32: not equal to the float64 term
    mp64 = evaluate_reference(message_passing(), positions, cell, pbc, species)
    assert np.abs(mp64.forces - mp_alone.forces).max() > 1e-9 * scale


def test_spec_combines_the_terms():
    spec = Pipeline(terms()).spec
    assert spec.cutoff == 6.0
    assert spec.layers == 2  # 2 x 4.0 reaches past one 6.0 cutoff, not past two
    assert spec.needs_positions
    assert spec.strategies == ("exchange", "shell")
    assert Pipeline([lennard_jones()]).spec.layers == 1


def test_model_file_round_trip(tmp_path):
    pipeline = Pipeline(terms())
    reloaded = load_model(save_model(pipeline, tmp_path / "pipeline.pt"))
    assert isinstance(reloaded, Pipeline)
    assert reloaded.config() == pipeline.config()
    positions, cell, species = system()
    a = evaluate_reference(pipeline, positions, cell, (True,) * 3, species)
    b = evaluate_reference(reloaded, positions, cell, (True,) * 3, species)
    assert a.energy == b.energy
    np.testing.assert_array_equal(a.forces, b.forces)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Pipeline([]), "at least one term"),
        (
            lambda: Pipeline([lennard_jones(), MessagePassing(["Ar"], cutoff=4.0)]),
            "export every term with the same elements",
        ),
        (
            lambda: Pipeline([lennard_jones(), ewald()], charges_from=[None, 0]),
            "predicts no charges",
        ),
        (
            lambda: Pipeline([lennard_jones(), ewald()], charges_from=[1, None]),
            "must be an earlier term",
        ),
        (
            lambda: Pipeline([lennard_jones(), lennard_jones()], charges_from=[None, None, None]),
            "3 entries for 2 terms",
        ),
    ],
    ids=["empty", "elements", "no-charges", "later-term", "length"],
)
def test_bad_pipelines_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        build()
