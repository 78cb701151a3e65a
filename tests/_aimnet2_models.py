"""Small AIMNet2 test systems and aimnet's own evaluation of them (importing this module
imports nothing from aimnet; the functions do)."""

from __future__ import annotations

import numpy as np
import torch
from _systems import System

from nvalchemi_lammps.reference import neighbor_pairs

ELEMENTS = ("H", "C", "N", "O")

#: Small molecules, Angstrom, centred near the origin: (symbols, positions).
MOLECULES = {
    "water": ("OHH", [[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0]]),
    "ammonia": ("NHHH", [[0.0, 0.0, 0.0], [1.01, 0.0, 0.0], [-0.34, 0.95, 0.0], [-0.34, -0.48, 0.83]]),
    "methane": (
        "CHHHH",
        [[0.0, 0.0, 0.0], [0.63, 0.63, 0.63], [-0.63, -0.63, 0.63], [-0.63, 0.63, -0.63],
         [0.63, -0.63, -0.63]],
    ),
    "formaldehyde": ("COHH", [[0.0, 0.0, 0.0], [1.21, 0.0, 0.0], [-0.55, 0.94, 0.0], [-0.55, -0.94, 0.0]]),
    "hcn": ("HCN", [[-1.07, 0.0, 0.0], [0.0, 0.0, 0.0], [1.16, 0.0, 0.0]]),
}  # fmt: skip


def _rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    return q * np.sign(np.diag(r))


def molecular_box(
    grid: tuple[int, int, int] = (2, 2, 2), spacing: float = 3.4, seed: int = 0
) -> System:
    """Randomly chosen and oriented small molecules on a grid in a periodic box (H, C, N, O;
    about 3.4 Angstrom between molecule centres, a liquid's density). Every box length is
    below twice the AIMNet2 cutoff of 5 Angstrom, so atoms see their own images."""
    rng = np.random.default_rng(seed)
    names = list(MOLECULES)
    positions, species = [], []
    for index in np.ndindex(*grid):
        symbols, xyz = MOLECULES[names[rng.integers(len(names))]]
        centre = (np.array(index) + 0.5 + rng.uniform(-0.1, 0.1, 3)) * spacing
        positions.append(np.asarray(xyz) @ _rotation(rng).T + centre)
        species += [ELEMENTS.index(s) for s in symbols]
    cell = np.diag(np.array(grid, dtype=np.float64) * spacing)
    return System(
        f"molecules_{'x'.join(map(str, grid))}_{seed}",
        np.concatenate(positions),
        cell,
        (True, True, True),
        np.array(species, dtype=np.int64),
        ELEMENTS,
    )


def molecules_vacuum() -> System:
    """:func:`molecular_box` with the box doubled along z: vacuum (6.8 Angstrom, more than
    the cutoff) above the molecules."""
    base = molecular_box()
    cell = base.cell.copy()
    cell[2, 2] *= 2.0
    return System("molecules_vacuum", base.positions, cell, base.pbc, base.species, base.elements)


def aimnet_forward(model: torch.nn.Module, system: System, charge: float = 0.0) -> dict:
    """aimnet's ``AIMNet2.forward_prepared`` on ``system`` (float64), in aimnet's own periodic
    layout: coordinates, cell, and a neighbor matrix of integer image shifts from vesin.
    Forces are ``-dE/dx``, the virial ``-dE/d(strain)`` (with the cell strained too)."""
    from aimnet import nbops

    atomic_numbers = {"H": 1, "C": 6, "N": 7, "O": 8}
    pairs = neighbor_pairs(system.positions, system.cell, system.pbc, float(model.aev.rc_s))
    n = system.natoms
    counts = np.bincount(pairs.pair_i, minlength=n + 1)
    width = int(counts.max())
    slot = np.arange(len(pairs.pair_i)) - (np.cumsum(counts) - counts)[pairs.pair_i]
    nbmat = np.full((n + 1, width), n, dtype=np.int64)
    nbmat[pairs.pair_i, slot] = pairs.pair_j
    shifts = np.zeros((n + 1, width, 3))
    shifts[pairs.pair_i, slot] = pairs.shifts

    coord = torch.tensor(np.concatenate([system.positions, np.zeros((1, 3))]), requires_grad=True)
    strain = torch.zeros(3, 3, dtype=torch.float64, requires_grad=True)
    deform = torch.eye(3, dtype=torch.float64) + strain
    numbers = [atomic_numbers[system.elements[s]] for s in system.species] + [0]
    data = {
        "coord": coord @ deform,
        "cell": torch.tensor(system.cell) @ deform,
        "numbers": torch.tensor(numbers),
        "charge": torch.tensor([float(charge)], dtype=torch.float64),
        "nbmat": torch.from_numpy(nbmat).to(torch.int32),
        "shifts": torch.from_numpy(shifts),
        "mol_idx": torch.zeros(n + 1, dtype=torch.int64),
    }
    data = nbops.calc_masks(nbops.set_nb_mode(data))
    out = model.forward_prepared(data)
    energy = out["energy"].sum()
    grad_x, grad_strain = torch.autograd.grad(energy, [coord, strain])
    return {
        "energy": float(energy.detach()),
        "forces": -grad_x[:n].numpy(),
        "virial": -grad_strain.numpy(),
        "charges": out["charges"].detach()[:n].numpy(),
    }


#: Scale of the charge-weight outputs in :func:`random_aimnet2` (see there).
CHARGE_WEIGHT_SCALE = 100.0


def random_aimnet2(seed: int = 0, dtype: str = "float64", model: dict | None = None):
    """AIMNet2 with random weights from aimnet's packaged architecture, made to equilibrate
    charges like a trained model.

    aimnet's equilibration (``aimnet.ops.nse``) hands each atom a share ``f_i / (F + 1e-6)``
    of the charge excess, ``F = sum f_i``. Its random initialization gives ``f_i`` of
    ~1e-4, so the 1e-6 leaves ~1e-4 e of the net charge unassigned; trained models have
    ``f_i`` of order one. The MLP output rows that make ``f`` (``f = out[1]**2``) are
    scaled by :data:`CHARGE_WEIGHT_SCALE`, which makes the unassigned part ~1e-8 e.
    """
    from nvalchemi_lammps.potentials.aimnet2 import AIMNet2

    potential = AIMNet2.random_weights(list(ELEMENTS), seed=seed, dtype=dtype, model=model)
    with torch.no_grad():
        for mlp in potential.model.mlps[:-1]:
            last = [m for m in mlp if isinstance(m, torch.nn.Linear)][-1]
            last.weight[1] *= CHARGE_WEIGHT_SCALE
            last.bias[1] *= CHARGE_WEIGHT_SCALE
    return potential
