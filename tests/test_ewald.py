"""Ewald summation without LAMMPS: the Madelung constant of rock salt, independence of
alpha, forces and virial against finite differences, the collectives a rank issues, and
the error branches."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from nvalchemi_lammps import Ewald, NoOpComm
from nvalchemi_lammps.engine import evaluate
from nvalchemi_lammps.potentials.ewald import QQR2E
from nvalchemi_lammps.reference import evaluate_reference

#: Rock salt, nearest-neighbour distance as unit: E = -M q^2 / r0 per ion pair.
MADELUNG = 1.747564594633182190636
LATTICE = 5.64
PBC = (True, True, True)


def _rock_salt(cells: int, displacement: float = 0.0, seed: int = 0):
    fcc = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    grid = np.array(
        [[i, j, k] for i in range(cells) for j in range(cells) for k in range(cells)], float
    )
    sodium = (grid[:, None, :] + fcc[None]).reshape(-1, 3)
    frac = np.vstack([sodium, sodium + np.array([0.5, 0.0, 0.0])]) / cells
    cell = np.eye(3) * LATTICE * cells
    rng = np.random.default_rng(seed)
    positions = frac @ cell + rng.normal(0.0, displacement, size=frac.shape)
    species = np.repeat([0, 1], len(sodium))
    return positions, cell, species, np.where(species == 0, 1.0, -1.0)


def _small_triclinic(net_charge: float = -0.4, seed: int = 3):
    """12 ions of random charge in a skewed cell."""
    rng = np.random.default_rng(seed)
    cell = np.array([[7.0, 0.0, 0.0], [1.5, 6.5, 0.0], [-1.0, 1.2, 7.5]])
    positions = rng.random((12, 3)) @ cell
    charges = rng.uniform(-1.0, 1.0, 12)
    charges -= charges.mean() - net_charge / 12
    return positions, cell, np.zeros(12, dtype=np.int64), charges


def _energy(potential, positions, cell, species, charges) -> float:
    return evaluate_reference(potential, positions, cell, PBC, species, charges=charges).energy


def test_rock_salt_madelung_constant():
    positions, cell, species, charges = _rock_salt(2)
    potential = Ewald(["Na", "Cl"], cutoff=12.0, alpha=0.5, kmax=12)
    pairs = len(positions) // 2
    expected = -pairs * MADELUNG * QQR2E["metal"] / (LATTICE / 2)
    energy = _energy(potential, positions, cell, species, charges)
    assert energy == pytest.approx(expected, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("system", ["rock-salt-displaced", "triclinic-charged"])
def test_energy_is_independent_of_alpha(system):
    if system == "rock-salt-displaced":
        positions, cell, species, charges = _rock_salt(2, displacement=0.3, seed=1)
    else:  # net charge: the neutralizing background must make it alpha-independent too
        positions, cell, species, charges = _small_triclinic()
    energies = [
        _energy(
            Ewald(["Na", "Cl"], cutoff=14.0, alpha=a, kmax=14), positions, cell, species, charges
        )
        for a in (0.45, 0.55)
    ]
    assert energies[0] == pytest.approx(energies[1], rel=1e-8, abs=0.0)


@pytest.mark.parametrize("net_charge", [0.0, -0.4], ids=["neutral", "charged"])
def test_forces_and_virial_are_derivatives_of_the_energy(net_charge):
    positions, cell, species, charges = _small_triclinic(net_charge)
    potential = Ewald(["X"], cutoff=6.0, alpha=0.5, kmax=6)
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
    positions, cell, species, charges = _rock_salt(1, displacement=0.2, seed=2)
    per_atom = Ewald(["Na", "Cl"], cutoff=8.0, alpha=0.4, kmax=6)
    fixed = Ewald(["Na", "Cl"], cutoff=8.0, alpha=0.4, kmax=6, charges={"Na": 1.0, "Cl": -1.0})
    a = evaluate_reference(per_atom, positions, cell, PBC, species, charges=charges)
    b = evaluate_reference(fixed, positions, cell, PBC, species)
    assert a.energy == b.energy
    np.testing.assert_array_equal(a.forces, b.forces)


class _CountingComm(NoOpComm):
    def __init__(self) -> None:
        self.sizes: list[tuple[int, ...]] = []

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        self.sizes.append(tuple(x.shape))
        return x


@pytest.mark.parametrize("nlocal", [0, 8])
def test_every_rank_issues_the_same_collectives(nlocal):
    """A rank with no atoms issues the same collectives, of the same sizes, as any other."""
    positions, cell, species, charges = _rock_salt(1)
    potential = Ewald(["Na", "Cl"], cutoff=5.0, alpha=0.5, kmax=4)
    comm = _CountingComm()
    result = evaluate(
        potential,
        nlocal,
        torch.from_numpy(species[:nlocal]),
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, 3, dtype=torch.float64),
        comm,
        positions=torch.from_numpy(positions[:nlocal]),
        cell=torch.from_numpy(cell),
        pbc=PBC,
        charges=torch.from_numpy(charges[:nlocal]),
    )
    nvectors = comm.sizes[1][1]
    assert comm.sizes == [(3,), (2, nvectors)] and nvectors > 0
    assert result.atom_forces.shape == (nlocal, 3)


@pytest.mark.parametrize(
    "kwargs, graph_change, message",
    [
        ({"alpha": 0.3}, {}, "ewald needs alpha and kmax, or accuracy to derive them"),
        ({"alpha": 0.3, "kmax": [4, 4]}, {}, "kmax must be a positive integer or three of them"),
        ({"accuracy": 1e-5, "charges": {"Na": 1.0}}, {}, "charges missing for element(s) Cl"),
        ({"accuracy": 1e-5}, {"pbc": (True, True, False)}, "periodic in all three directions"),
        ({"accuracy": 1e-5}, {"charges": None}, "ewald needs per-atom charges"),
    ],
    ids=["no-alpha-kmax", "bad-kmax", "missing-charge", "non-periodic", "no-charges"],
)
def test_errors(kwargs, graph_change, message):
    positions, cell, species, charges = _rock_salt(1)
    with pytest.raises(ValueError, match=re.escape(message)):
        potential = Ewald(["Na", "Cl"], cutoff=5.0, **kwargs)
        inputs = {"pbc": PBC, "charges": charges} | graph_change
        evaluate_reference(potential, positions, cell, inputs["pbc"], species, inputs["charges"])
