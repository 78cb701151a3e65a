"""Small UMA test models and systems, and fairchem's own evaluation of them (importing this
module imports nothing from fairchem; the functions do)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from _systems import System

ELEMENTS = ("H", "C", "O", "Cu")
TASKS = {"omat": "omat", "omol": "omol"}

#: A small eSCN-MD backbone (UMA's architecture at a fraction of its width): 2 blocks,
#: l <= 2, 8 channels, cutoff 4 Angstrom. Random weights, drawn by fairchem's initialization.
BACKBONE = {
    "max_num_elements": 100,
    "sphere_channels": 8,
    "lmax": 2,
    "mmax": 2,
    "cutoff": 4.0,
    "max_neighbors": 300,
    "edge_channels": 8,
    "num_distance_basis": 16,
    "num_layers": 2,
    "hidden_channels": 8,
    "norm_type": "rms_norm_sh",
    "act_type": "gate",
    "ff_type": "grid",
    "chg_spin_emb_type": "pos_emb",
    "dataset_mapping": TASKS,
}

#: The same with UMA's charge and spin channel balancing (sums over the whole system).
BALANCED_BACKBONE = {
    **BACKBONE,
    "charge_balanced_channels": [0, 1],
    "spin_balanced_channels": [2],
}


def random_uma(
    seed: int = 0,
    dtype: str = "float64",
    task: str = "omat",
    spin: int = 0,
    backbone: dict | None = None,
):
    from nvalchemi_lammps.potentials.uma import Uma

    return Uma.random_weights(
        BACKBONE if backbone is None else backbone,
        list(ELEMENTS),
        task,
        seed=seed,
        spin=spin,
        dtype=dtype,
    )


def copper_oxide_box(seed: int = 0) -> System:
    """16 atoms of Cu, O, C and H, rattled off a 2x2x1 fcc-like lattice (a = 3.6 Angstrom):
    a 7.2 x 7.2 x 3.6 Angstrom periodic box, shorter along z than the cutoff, so atoms see
    their own images."""
    rng = np.random.default_rng(seed)
    basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
    cells = np.array(list(np.ndindex(2, 2, 1)))
    frac = (cells[:, None, :] + basis[None, :, :]).reshape(-1, 3) / np.array([2, 2, 1])
    cell = np.diag([7.2, 7.2, 3.6])
    positions = frac @ cell + rng.normal(scale=0.15, size=frac.shape)
    species = rng.choice(len(ELEMENTS), size=len(frac), p=[0.25, 0.15, 0.25, 0.35])
    return System(
        f"cuohc_{seed}",
        positions,
        cell,
        (True, True, True),
        species.astype(np.int64),
        ELEMENTS,
    )


def fairchem_forward(potential, system: System, charge: int = 0) -> dict:
    """fairchem's own ``eSCNMDBackbone.forward`` and ``MLP_EFS_Head`` on ``system`` with the
    potential's weights (in its dtype), fairchem building the periodic radius graph itself:
    energy, forces ``-dE/dx`` and the virial ``-dE/d(strain)`` (``-V`` times its stress)."""
    from ase import Atoms
    from fairchem.core.datasets.atomic_data import AtomicData, atomicdata_list_to_batch
    from fairchem.core.models.uma.escn_md import MLP_EFS_Head

    dtype = potential.spec.torch_dtype
    backbone = copy.deepcopy(potential.backbone)
    backbone.otf_graph = True
    backbone.regress_config.forces = True
    backbone.regress_config.stress = True
    head = MLP_EFS_Head(backbone).to(dtype)
    head.energy_block.load_state_dict(potential.energy_block.state_dict())

    atoms = Atoms(
        [system.elements[s] for s in system.species],
        positions=system.positions,
        cell=system.cell,
        pbc=system.pbc,
    )
    data = AtomicData.from_ase(atoms, task_name=potential.task, target_dtype=dtype)
    batch = atomicdata_list_to_batch([data])
    batch.charge = torch.tensor([charge])
    batch.spin = torch.tensor([potential.spin])
    out = head(batch, backbone(batch))
    volume = abs(float(np.linalg.det(system.cell)))
    return {
        "energy": float(out["energy"]["energy"].detach().sum()),
        "forces": out["forces"]["forces"].detach().double().numpy(),
        "virial": -volume * out["stress"]["stress"].detach().double().numpy().reshape(3, 3),
    }


def copper_oxide_slab(seed: int = 0) -> System:
    """:func:`copper_oxide_box` in a box three times as tall along z, atoms lifted by
    0.6 Angstrom: 7.2 Angstrom of vacuum (more than the cutoff) above them, and the upper
    half of the box (z > 5.4 Angstrom) empty."""
    base = copper_oxide_box(seed)
    cell = base.cell.copy()
    cell[2, 2] *= 3.0
    positions = base.positions + np.array([0.0, 0.0, 0.6])
    assert 0.0 < positions[:, 2].min() and positions[:, 2].max() < cell[2, 2] / 2
    return System(f"cuohc_slab_{seed}", positions, cell, base.pbc, base.species, ELEMENTS)
