"""Ewald summation without LAMMPS: the Madelung constant of rock salt, independence of
alpha, forces and virial against finite differences, the slab correction, the collectives
a rank issues, and the error branches."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from _ionic_systems import (
    LATTICE,
    MADELUNG,
    PBC,
    SLAB_PBC,
    allreduce_sizes,
    on_rock_salt,
    rock_salt,
    slab_energy,
    slab_system,
    small_triclinic,
)

from nvalchemi_lammps import Ewald, LocalGraph
from nvalchemi_lammps.potentials.ewald import QQR2E
from nvalchemi_lammps.reference import evaluate_reference, neighbor_pairs


def _energy(potential, positions, cell, species, charges) -> float:
    return evaluate_reference(potential, positions, cell, PBC, species, charges=charges).energy


def test_rock_salt_madelung_constant():
    positions, cell, species, charges = rock_salt(2)
    potential = Ewald(["Na", "Cl"], cutoff=12.0, alpha=0.5, kmax=12)
    pairs = len(positions) // 2
    expected = -pairs * MADELUNG * QQR2E["metal"] / (LATTICE / 2)
    energy = _energy(potential, positions, cell, species, charges)
    assert energy == pytest.approx(expected, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("system", ["rock-salt-displaced", "triclinic-charged"])
def test_energy_is_independent_of_alpha(system):
    if system == "rock-salt-displaced":
        positions, cell, species, charges = rock_salt(2, displacement=0.3, seed=1)
    else:  # net charge: the neutralizing background must make it alpha-independent too
        positions, cell, species, charges = small_triclinic()
    energies = [
        _energy(
            Ewald(["Na", "Cl"], cutoff=14.0, alpha=a, kmax=14, background=True),
            positions,
            cell,
            species,
            charges,
        )
        for a in (0.45, 0.55)
    ]
    assert energies[0] == pytest.approx(energies[1], rel=1e-8, abs=0.0)


@pytest.mark.parametrize("net_charge", [0.0, -0.4], ids=["neutral", "charged"])
def test_forces_and_virial_are_derivatives_of_the_energy(net_charge):
    positions, cell, species, charges = small_triclinic(net_charge)
    potential = Ewald(["X"], cutoff=6.0, alpha=0.5, kmax=6, background=True)
    ref = evaluate_reference(potential, positions, cell, PBC, species, charges=charges)
    h = 1e-5
    for atom, axis in [(0, 0), (5, 1), (11, 2)]:
        shifted = [positions.copy(), positions.copy()]
        shifted[0][atom, axis] += h
        shifted[1][atom, axis] -= h
        e_plus, e_minus = (_energy(potential, x, cell, species, charges) for x in shifted)
        assert ref.forces[atom, axis] == pytest.approx(-(e_plus - e_minus) / (2 * h), abs=1e-7)
    # LAMMPS's virial W = -dE/d(strain) with positions and cell strained together
    for a, b in [(0, 0), (1, 1), (0, 1), (1, 2), (0, 2)]:  # the upper triangle LAMMPS keeps
        energies = []
        for sign in (1.0, -1.0):
            strain = np.eye(3)
            strain[a, b] += sign * h
            energies.append(_energy(potential, positions @ strain, cell @ strain, species, charges))
        # LAMMPS leaves the volume dependence of the neutralizing background out of the
        # virial, and so do we: -dE_background/d(strain_aa) = E_background is missing
        background = (
            -QQR2E["metal"] * np.pi * charges.sum() ** 2 / (2 * 0.5**2 * abs(np.linalg.det(cell)))
        )
        missing = background if a == b else 0.0
        expected = -(energies[0] - energies[1]) / (2 * h) - missing
        assert ref.virial[a, b] == pytest.approx(expected, abs=1e-6)


def test_fixed_element_charges_equal_per_atom_charges():
    positions, cell, species, charges = rock_salt(1, displacement=0.2, seed=2)
    per_atom = Ewald(["Na", "Cl"], cutoff=8.0, alpha=0.4, kmax=6)
    fixed = Ewald(["Na", "Cl"], cutoff=8.0, alpha=0.4, kmax=6, charges={"Na": 1.0, "Cl": -1.0})
    a = evaluate_reference(per_atom, positions, cell, PBC, species, charges=charges)
    b = evaluate_reference(fixed, positions, cell, PBC, species)
    assert a.energy == b.energy
    np.testing.assert_array_equal(a.forces, b.forces)


@pytest.mark.parametrize("nlocal", [0, 8])
def test_every_rank_issues_the_same_collectives(nlocal):
    """A rank with no atoms issues the same collectives, of the same sizes, as any other."""
    potential = Ewald(["Na", "Cl"], cutoff=5.0, alpha=0.5, kmax=4)
    sizes, result = allreduce_sizes(potential, nlocal)
    nvectors = sizes[1][1]
    assert sizes == [(5,), (2, nvectors)] and nvectors > 0
    assert result.atom_forces.shape == (nlocal, 3)


#: What the constructor or the evaluation refuses: (arguments, input changes, message).
ERRORS = {
    "no-alpha-kmax": ({"alpha": 0.3}, {}, "ewald needs alpha and kmax, or accuracy to derive them"),
    "bad-kmax": (
        {"alpha": 0.3, "kmax": [4, 4]},
        {},
        "kmax must be a positive integer or three of them",
    ),
    "missing-charge": (
        {"accuracy": 1e-5, "charges": {"Na": 1.0}},
        {},
        "charges missing for element(s) Cl",
    ),
    "slab-factor": ({"accuracy": 1e-5, "slab": 1.0}, {}, "slab must be a volume factor above 1"),
    "background-not-bool": (
        {"accuracy": 1e-5, "background": "yes"},
        {},
        "background must be true or false",
    ),
    "non-periodic-without-slab": (
        {"accuracy": 1e-5},
        {"pbc": (True, True, False)},
        (
            "ewald without slab needs a box periodic in x, y and z, got pbc=(True, True, False)"
            ": for boundary p p f set slab"
        ),
    ),
    "slab-with-periodic-z": (
        {"accuracy": 1e-5, "slab": 3.0},
        {},
        (
            "ewald with slab needs boundary p p f (x and y periodic, z not), "
            "got pbc=(True, True, True)"
        ),
    ),
    "net-charge-without-background": (
        {"accuracy": 1e-5},
        {"shift": 0.01},
        (
            "ewald: the system has a net charge of 0.08 e; make the charges sum to zero, or "
            "set background = true"
        ),
    ),
    "cutoff-too-short-for-alpha": (
        {"alpha": 0.2, "kmax": 4, "accuracy": 1e-5},
        {},
        "ewald: real-space cutoff 5 too short for alpha 0.2 at accuracy 1e-05",
    ),
    "no-charges": ({"accuracy": 1e-5}, {"charges": None}, "ewald needs per-atom charges"),
}


@pytest.mark.parametrize(("kwargs", "graph_change", "message"), ERRORS.values(), ids=ERRORS.keys())
def test_errors(kwargs, graph_change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        on_rock_salt(Ewald, kwargs, graph_change)


def test_explicit_alpha_within_the_accuracy_is_accepted():
    """The alpha LAMMPS derives for this cutoff and accuracy passes the real-space check."""
    positions, cell, species, charges = rock_salt(1)
    derived = Ewald(["Na", "Cl"], cutoff=5.0, accuracy=1e-5)
    alpha, kmax = derived.parameters_for(
        torch.from_numpy(cell), len(positions), float((charges**2).sum())
    )
    explicit = Ewald(["Na", "Cl"], cutoff=5.0, alpha=alpha, kmax=list(kmax), accuracy=1e-5)
    a, b = (
        evaluate_reference(p, positions, cell, PBC, species, charges) for p in (derived, explicit)
    )
    assert a.energy == b.energy


@pytest.mark.parametrize("net_charge", [0.0, 0.6], ids=["neutral", "charged"])
def test_slab_is_the_extended_box_plus_the_dipole_correction(net_charge):
    """Ewald with slab 3 = Ewald of the box three times higher, periodic in z too (no pair
    reaches an image across the vacuum), plus LAMMPS's dipole correction."""
    positions, cell, species, charges = slab_system(net_charge)
    kwargs = {"cutoff": 6.0, "alpha": 0.5, "kmax": [6, 6, 12], "background": True}
    slab = evaluate_reference(
        Ewald(["Na", "Cl"], slab=3.0, **kwargs), positions, cell, SLAB_PBC, species, charges
    )
    extended = cell.copy()
    extended[2, 2] *= 3.0
    periodic = evaluate_reference(
        Ewald(["Na", "Cl"], **kwargs), positions, extended, PBC, species, charges
    )
    correction = slab_energy(positions, cell, charges, 3.0)
    assert abs(correction) > 1e-3 * abs(slab.energy)  # the dipole matters
    assert slab.energy == pytest.approx(periodic.energy + correction, rel=1e-13, abs=0.0)
    # its force: -4 pi qqr2e q_i (M - Q z_i) / V along z
    volume = 3.0 * abs(np.linalg.det(cell))
    dipole, z = charges @ positions[:, 2], positions[:, 2]
    force = -4.0 * np.pi * QQR2E["metal"] * charges * (dipole - charges.sum() * z) / volume
    expected = periodic.forces + np.stack([0 * z, 0 * z, force], axis=1)
    np.testing.assert_allclose(slab.forces, expected, rtol=0, atol=1e-11)


def test_slab_forces_and_virial_are_derivatives_of_the_energy():
    """Forces by finite differences; the virial too, without the slab correction's part,
    which LAMMPS leaves out of the pressure and so do we."""
    positions, cell, species, charges = slab_system(net_charge=0.6)
    potential = Ewald(
        ["Na", "Cl"], cutoff=6.0, alpha=0.5, kmax=[6, 6, 12], slab=3.0, background=True
    )

    def energy(x, h):
        return evaluate_reference(potential, x, h, SLAB_PBC, species, charges).energy

    ref = evaluate_reference(potential, positions, cell, SLAB_PBC, species, charges)
    h = 1e-5
    for atom, axis in [(0, 2), (17, 0), (40, 2)]:
        shifted = [positions.copy(), positions.copy()]
        shifted[0][atom, axis] += h
        shifted[1][atom, axis] -= h
        fd = -(energy(shifted[0], cell) - energy(shifted[1], cell)) / (2 * h)
        assert ref.forces[atom, axis] == pytest.approx(fd, abs=1e-7)
    # strains that keep the first two cell vectors in the xy plane, as LAMMPS's box; the
    # rest of the energy turns with the box, so its virial is symmetric
    for a, b in [(0, 0), (2, 2), (2, 0), (2, 1)]:
        differences = []
        for sign in (1.0, -1.0):
            strain = np.eye(3)
            strain[a, b] += sign * h
            x, box = positions @ strain, cell @ strain
            differences.append(energy(x, box) - slab_energy(x, box, charges, 3.0))
        # the background's volume dependence is left out as well (see the periodic test)
        volume = 3.0 * abs(np.linalg.det(cell))
        background = -QQR2E["metal"] * np.pi * charges.sum() ** 2 / (2 * 0.5**2 * volume)
        missing = background if a == b else 0.0
        expected = -(differences[0] - differences[1]) / (2 * h) - missing
        assert ref.virial[a, b] == pytest.approx(expected, abs=1e-6)


def test_gradient_with_respect_to_charges():
    """Charges a model predicts get the full derivative of the energy, global sums (net
    charge, dipole) included: autograd dE/dq against finite differences."""
    positions, cell, species, charges = slab_system(net_charge=0.6)
    potential = Ewald(
        ["Na", "Cl"], cutoff=6.0, alpha=0.5, kmax=[6, 6, 12], slab=3.0, background=True
    )
    pairs = neighbor_pairs(positions, cell, SLAB_PBC, 6.0)

    def energy(q: torch.Tensor) -> torch.Tensor:
        graph = LocalGraph(
            nlocal=len(q),
            species=torch.from_numpy(species),
            pair_i=torch.from_numpy(pairs.pair_i),
            pair_j=torch.from_numpy(pairs.pair_j),
            rij=torch.from_numpy(pairs.rij),
            positions=torch.from_numpy(positions),
            cell=torch.from_numpy(cell),
            pbc=SLAB_PBC,
            charges=q,
        )
        return potential(graph).sum()

    q = torch.from_numpy(charges).requires_grad_(True)
    (grad,) = torch.autograd.grad(energy(q), q)
    h = 1e-6
    for atom in (0, 9, 33):
        step = torch.zeros_like(q)
        step[atom] = h
        fd = (energy(q.detach() + step) - energy(q.detach() - step)) / (2 * h)
        assert float(grad[atom]) == pytest.approx(float(fd), rel=1e-7)
