"""Particle-mesh Ewald without LAMMPS: its B-splines, convergence to our Ewald sum (periodic,
triclinic with a net charge, slab), agreement with nvalchemiops's PME, forces and virial
against finite differences, the collectives a rank issues, and the error branches."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import pytest
import torch
from _ionic_systems import (
    PBC,
    SLAB_PBC,
    allreduce_sizes,
    on_rock_salt,
    rock_salt,
    slab_energy,
    slab_system,
    small_triclinic,
)

from nvalchemi_lammps import LocalGraph
from nvalchemi_lammps.potentials.ewald import Ewald
from nvalchemi_lammps.potentials.pme import Pme, bspline_weights
from nvalchemi_lammps.reference import evaluate_reference

ELEMENTS = ["Na", "Cl"]


def _relative(got, ref) -> float:
    got, ref = np.asarray(got), np.asarray(ref)
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _cardinal_bspline(x: Fraction, order: int) -> Fraction:
    """``M_n(x) = 1/(n-1)! sum_k (-1)^k C(n, k) (x - k)_+^(n-1)``, in exact arithmetic."""
    terms = (
        (-1) ** k * math.comb(order, k) * max(x - k, Fraction(0)) ** (order - 1)
        for k in range(order + 1)
    )
    return sum(terms, Fraction(0)) / math.factorial(order - 1)


@pytest.mark.parametrize("order", [3, 4, 5, 6, 7])
def test_bspline_weights_are_the_cardinal_bspline(order):
    """Against the B-spline's closed form in exact rational arithmetic."""
    f = torch.linspace(0.0, 0.999, 37, dtype=torch.float64)
    weights = bspline_weights(f, order)
    exact = torch.tensor(
        [
            [float(_cardinal_bspline(Fraction(float(v)) + j, order)) for j in range(order)]
            for v in f
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(weights, exact, rtol=0.0, atol=1e-15)
    torch.testing.assert_close(weights.sum(dim=1), torch.ones_like(f), rtol=0.0, atol=1e-15)


CONVERGED = {
    # name: (system, pbc, extra arguments, Ewald kmax, PME mesh)
    "rock-salt": (rock_salt(2, displacement=0.3, seed=1), PBC, {}, [10, 10, 10], [48, 48, 48]),
    "triclinic-charged": (
        small_triclinic(),
        PBC,
        {"background": True},
        [10, 10, 10],
        [48, 48, 48],
    ),
    "slab-charged": (
        slab_system(net_charge=0.6),
        SLAB_PBC,
        {"background": True, "slab": 3.0},
        [10, 10, 43],
        [48, 48, 144],
    ),
}


@pytest.mark.parametrize("case", list(CONVERGED))
def test_pme_converges_to_ewald(case):
    """At order 7 and mesh spacings of 0.15-0.33 A PME's discretization error is below
    these tolerances (measured: energy <= 4e-11, forces <= 5e-8, virial <= 2e-9
    relative); the Ewald sum has every k-vector with exp(-k^2/4 alpha^2) above 1e-13."""
    (positions, cell, species, charges), pbc, extra, kmax, mesh = CONVERGED[case]
    ewald = Ewald(ELEMENTS, cutoff=6.0, alpha=0.5, kmax=kmax, **extra)
    pme = Pme(ELEMENTS, cutoff=6.0, alpha=0.5, mesh=mesh, order=7, **extra)
    a = evaluate_reference(pme, positions, cell, pbc, species, charges)
    b = evaluate_reference(ewald, positions, cell, pbc, species, charges)
    assert a.energy == pytest.approx(b.energy, rel=1e-10, abs=0.0)
    assert _relative(a.forces, b.forces) < 1e-7
    assert _relative(a.virial, b.virial) < 1e-8
    assert a.atom_energies.sum() == pytest.approx(a.energy, rel=1e-14)


@pytest.mark.parametrize("order", [4, 5])
def test_reciprocal_space_equals_nvalchemiops(order):
    """Our reciprocal-space (+ self) energy per atom and its forces against nvalchemiops's
    ``pme_reciprocal_space`` (the same influence function; its B-spline is centred on the
    atom, ours starts at it: the same for even orders, half a mesh cell apart for odd
    ones, so its positions are shifted by that). What remains (measured ~4e-10 relative
    in energy, ~2e-8 per atom, ~8e-8 in forces) is nvalchemiops's spreading, which skips
    stencil weights below 1e-8 (``if weight > 1e-8`` in its ``math/spline.py`` spread
    kernel): the corner weights of an atom close to a mesh plane."""
    from nvalchemiops.torch.interactions.electrostatics.pme import pme_reciprocal_space

    positions, cell, species, charges = rock_salt(2, displacement=0.3, seed=1)
    mesh, alpha = (20, 24, 28), 0.4
    pme = Pme(ELEMENTS, cutoff=6.0, alpha=alpha, mesh=list(mesh), order=order)
    no_pairs = torch.zeros(0, dtype=torch.int64)
    x = torch.tensor(positions, requires_grad=True)
    graph = LocalGraph(
        nlocal=len(positions),
        species=torch.from_numpy(species),
        pair_i=no_pairs,
        pair_j=no_pairs,
        rij=torch.zeros(0, 3, dtype=torch.float64),
        positions=x,
        cell=torch.from_numpy(cell),
        pbc=PBC,
        charges=torch.from_numpy(charges),
    )
    ours = pme(graph) / pme.qqr2e
    (our_forces,) = torch.autograd.grad(ours.sum(), x)
    ours = ours.detach()

    shift = (order / 2) / torch.tensor(mesh, dtype=torch.float64) @ torch.from_numpy(cell)
    y = (torch.from_numpy(positions) - shift).requires_grad_(True)
    theirs = pme_reciprocal_space(
        y, torch.from_numpy(charges), torch.from_numpy(cell), alpha, mesh, spline_order=order
    )
    (their_forces,) = torch.autograd.grad(theirs.sum(), y)
    theirs = theirs.detach()
    assert float(ours.sum()) == pytest.approx(float(theirs.sum()), rel=1e-8, abs=0.0)
    assert _relative(ours, theirs) < 1e-7
    assert _relative(our_forces, their_forces) < 1e-6


def _energy(potential, positions, cell, pbc, species, charges) -> float:
    return evaluate_reference(potential, positions, cell, pbc, species, charges).energy


@pytest.mark.parametrize("case", ["triclinic-charged", "slab-charged"])
def test_forces_and_virial_are_derivatives_of_the_energy(case):
    """Forces and virial against central differences of the energy; LAMMPS leaves the
    neutralizing background's volume dependence and the slab correction out of the
    virial, and so do we."""
    if case == "triclinic-charged":
        positions, cell, species, charges = small_triclinic()
        pbc, extra, atoms = PBC, {}, [(0, 0), (5, 1), (11, 2)]
        strains = [(0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2)]
    else:
        positions, cell, species, charges = slab_system(net_charge=0.6)
        pbc, extra, atoms = SLAB_PBC, {"slab": 3.0}, [(0, 2), (17, 0), (40, 2)]
        strains = [(0, 0), (2, 2), (2, 0), (2, 1)]  # the box keeps a and b in the xy plane
    alpha = 0.5
    potential = Pme(ELEMENTS, cutoff=5.0, alpha=alpha, mesh=[12, 12, 24], background=True, **extra)
    ref = evaluate_reference(potential, positions, cell, pbc, species, charges)
    h = 1e-5
    for atom, axis in atoms:
        shifted = [positions.copy(), positions.copy()]
        shifted[0][atom, axis] += h
        shifted[1][atom, axis] -= h
        e_plus, e_minus = (_energy(potential, x, cell, pbc, species, charges) for x in shifted)
        assert ref.forces[atom, axis] == pytest.approx(-(e_plus - e_minus) / (2 * h), abs=1e-7)
    slab = extra.get("slab")
    volume = abs(np.linalg.det(cell)) * (slab or 1.0)
    background = -potential.qqr2e * np.pi * charges.sum() ** 2 / (2 * alpha**2 * volume)
    for a, b in strains:
        energies = []
        for sign in (1.0, -1.0):
            strain = np.eye(3)
            strain[a, b] += sign * h
            x, box = positions @ strain, cell @ strain
            energy = _energy(potential, x, box, pbc, species, charges)
            energies.append(energy - (slab_energy(x, box, charges, slab) if slab else 0.0))
        expected = -(energies[0] - energies[1]) / (2 * h) - (background if a == b else 0.0)
        assert ref.virial[a, b] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("nlocal", [0, 8])
def test_every_rank_issues_the_same_collectives(nlocal):
    """A rank with no atoms issues the same collectives, of the same sizes, as any other:
    the global sums, then the whole mesh."""
    potential = Pme(ELEMENTS, cutoff=5.0, alpha=0.5, mesh=[8, 9, 10])
    sizes, result = allreduce_sizes(potential, nlocal)
    assert sizes == [(5,), (8 * 9 * 10,)]
    assert result.atom_forces.shape == (nlocal, 3)


#: What the constructor or the evaluation refuses: (arguments, input changes, message).
ERRORS = {
    "no-alpha-mesh": ({"alpha": 0.3}, {}, "pme needs alpha and mesh, or accuracy to derive them"),
    "order": ({"accuracy": 1e-5, "order": 2}, {}, "order must be 3 to 7"),
    "mesh-length": ({"alpha": 0.3, "mesh": [8, 8]}, {}, "mesh must be one integer or three"),
    "mesh-below-order": ({"alpha": 0.3, "mesh": 4}, {}, "each at least the order 5; got 4"),
    "accuracy": ({"accuracy": -1e-5}, {}, "accuracy must be positive"),
    "slab-factor": ({"accuracy": 1e-5, "slab": 0.5}, {}, "slab must be a volume factor above 1"),
    "non-periodic-without-slab": (
        {"accuracy": 1e-5},
        {"pbc": (True, False, True)},
        "pme without slab needs a box periodic in x, y and z",
    ),
    "slab-with-periodic-z": (
        {"accuracy": 1e-5, "slab": 3.0},
        {},
        "pme with slab needs boundary p p f",
    ),
    "net-charge-without-background": (
        {"accuracy": 1e-5},
        {"shift": -0.01},
        "pme: the system has a net charge of -0.08 e",
    ),
    "cutoff-too-short-for-alpha": (
        {"alpha": 0.2, "mesh": 8, "accuracy": 1e-5},
        {},
        "pme: real-space cutoff 5 too short for alpha 0.2 at accuracy 1e-05",
    ),
    "no-charges": ({"alpha": 0.5, "mesh": 8}, {"charges": None}, "pme needs per-atom charges"),
}


@pytest.mark.parametrize(("kwargs", "graph_change", "message"), ERRORS.values(), ids=ERRORS.keys())
def test_errors(kwargs, graph_change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        on_rock_salt(Pme, kwargs, graph_change)


def test_model_file_round_trip(tmp_path):
    """A saved PME model gives the same numbers after loading (slab and background kept)."""
    from nvalchemi_lammps import load_model, save_model

    positions, cell, species, charges = slab_system(net_charge=0.6)
    potential = Pme(ELEMENTS, cutoff=5.0, accuracy=1e-4, order=4, slab=3.0, background=True)
    reloaded = load_model(save_model(potential, tmp_path / "pme.pt"))
    assert reloaded.config() == potential.config()
    assert reloaded.periodicity == (True, True, False)
    a, b = (
        evaluate_reference(p, positions, cell, SLAB_PBC, species, charges)
        for p in (potential, reloaded)
    )
    assert a.energy == b.energy
    np.testing.assert_array_equal(a.forces, b.forces)


def test_example_config_exports(tmp_path, capsys):
    """lammps_inputs/nacl_pme.toml exports (and passes the export's reload check)."""
    from pathlib import Path

    from nvalchemi_lammps import load_model
    from nvalchemi_lammps.cli import export as export_cli

    config = Path(__file__).resolve().parents[1] / "lammps_inputs" / "nacl_pme.toml"
    out = tmp_path / "nacl_pme.pt"
    assert export_cli.main([str(config), "-o", str(out)]) == 0
    capsys.readouterr()
    model = load_model(out)
    assert isinstance(model, Pme)
    assert (model.accuracy, model.order, model.spec.cutoff) == (1e-5, 5, 10.0)
