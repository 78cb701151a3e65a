"""Ionic systems the electrostatics tests share (tests/test_ewald.py, tests/test_pme.py):
rock salt, a small charged triclinic box, a slab with a dipole."""

from __future__ import annotations

import numpy as np

from nvalchemi_lammps.potentials.ewald import QQR2E

#: Rock salt, nearest-neighbour distance as unit: E = -M q^2 / r0 per ion pair.
MADELUNG = 1.747564594633182190636
LATTICE = 5.64
PBC = (True, True, True)


def rock_salt(cells: int, displacement: float = 0.0, seed: int = 0):
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


def small_triclinic(net_charge: float = -0.4, seed: int = 3):
    """12 ions of random charge in a skewed cell."""
    rng = np.random.default_rng(seed)
    cell = np.array([[7.0, 0.0, 0.0], [1.5, 6.5, 0.0], [-1.0, 1.2, 7.5]])
    positions = rng.random((12, 3)) @ cell
    charges = rng.uniform(-1.0, 1.0, 12)
    charges -= charges.mean() - net_charge / 12
    return positions, cell, np.zeros(12, dtype=np.int64), charges


SLAB_PBC = (True, True, False)


def slab_system(net_charge: float = 0.0):
    """Rock salt, 2x2x2 cells, with Na shifted up and Cl down along z (a dipole normal to
    the slab), in a box periodic in x and y, 16 A high."""
    positions, cell, species, charges = rock_salt(2, displacement=0.2, seed=4)
    positions[:, 2] += np.where(species == 0, 0.15, -0.15) + 2.0
    cell[2, 2] = 16.0
    charges = charges + net_charge / len(charges)
    return positions, cell, species, charges


def slab_energy(positions, cell, charges, slab: float) -> float:
    """LAMMPS's ``slabcorr`` energy: ``2 pi / V (M^2 - Q sum q z^2 - Q^2 Lz^2 / 12)`` over
    the extended box (metal units)."""
    height = slab * cell[2, 2]
    volume = abs(np.linalg.det(cell)) * slab
    z, q = positions[:, 2], charges
    total = q.sum()
    moments = (q @ z) ** 2 - total * (q @ z**2) - total**2 * height**2 / 12.0
    return QQR2E["metal"] * 2.0 * np.pi / volume * moments


def allreduce_sizes(potential, nlocal: int) -> tuple[list[tuple[int, ...]], object]:
    """Evaluate ``potential`` on the first ``nlocal`` ions of one rock-salt cell as a rank
    without pairs would, recording the shape of every all-reduce it issues: (shapes, the
    evaluation)."""
    import torch

    from nvalchemi_lammps import LocalGraph, NoOpComm
    from nvalchemi_lammps.engine import evaluate

    class Counting(NoOpComm):
        def __init__(self) -> None:
            self.sizes: list[tuple[int, ...]] = []

        def allreduce(self, x: torch.Tensor) -> torch.Tensor:
            self.sizes.append(tuple(x.shape))
            return x

    positions, cell, species, charges = rock_salt(1)
    comm = Counting()
    graph = LocalGraph(
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
    return comm.sizes, evaluate(potential, graph)


def on_rock_salt(potential_class, options: dict, graph_change: dict):
    """``potential_class(["Na", "Cl"], cutoff=5.0, **options)`` on one rock-salt cell, its
    inputs changed by ``graph_change`` (``pbc``, ``charges``, or ``shift``: added to every
    charge): where a test expects the constructor's or the evaluation's error."""
    from nvalchemi_lammps.reference import evaluate_reference

    positions, cell, species, charges = rock_salt(1)
    change = dict(graph_change)
    charges = charges + change.pop("shift", 0.0)
    potential = potential_class(["Na", "Cl"], cutoff=5.0, **options)
    inputs = {"pbc": PBC, "charges": charges} | change
    return evaluate_reference(potential, positions, cell, inputs["pbc"], species, inputs["charges"])
