"""Small UMA test models and systems, and fairchem's own evaluation of them (importing this
module imports nothing from fairchem; the functions do)."""

from __future__ import annotations

import contextlib
import copy
import warnings

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


# --- UMA's released architecture: a fairchem checkpoint file --------------------------------

#: The datasets of the mixture-of-experts checkpoints (as in uma-s-1p1, without odac, omc).
MOE_TASKS = {"oc20": "oc20", "omat": "omat", "omol": "omol"}

#: uma-s-1p1's backbone options (mixture of linear experts in the SO(2) convolutions, mixed
#: by the composition and the charge / spin / task embedding; random charge and spin
#: embeddings; model_version 1.1) at a fraction of its size: 2 blocks, l <= 2, 8 channels,
#: 4 experts, cutoff 4 Angstrom.
MOE_BACKBONE = {
    **BACKBONE,
    "model": "fairchem.core.models.uma.escn_moe.eSCNMDMoeBackbone",
    "chg_spin_emb_type": "rand_emb",
    "dataset_mapping": MOE_TASKS,
    "otf_graph": True,
    "regress_forces": True,
    "regress_stress": True,
    "direct_forces": False,
    "num_experts": 4,
    "use_composition_embedding": True,
    "moe_expert_coefficient_norm": "softmax",
    "moe_type": "so2",
    "model_version": 1.1,
}

#: fairchem's heads: one MLP_EFS_Head shared by all datasets (uma-s-1p1), or one expert per
#: dataset (DatasetSpecificMoEWrapper).
MOE_HEADS = {
    "single": {
        "module": "fairchem.core.models.uma.escn_moe.DatasetSpecificSingleHeadWrapper",
        "head_cls": "fairchem.core.models.uma.escn_md.MLP_EFS_Head",
        "head_kwargs": {"wrap_property": False},
        "dataset_names": sorted(MOE_TASKS),
    },
    "experts": {
        "module": "fairchem.core.models.uma.escn_moe.DatasetSpecificMoEWrapper",
        "head_cls": "fairchem.core.models.uma.escn_md.MLP_EFS_Head",
        "head_kwargs": {"wrap_property": False},
        "dataset_mapping": MOE_TASKS,
    },
}


@contextlib.contextmanager
def _fairchem_quietly():
    """fairchem scripts functions with ``torch.jit.script``, which torch deprecates (the
    tests turn warnings into errors); its loaders warn about ``weights_only``, its expert
    mixing that ``index_reduce`` is in beta."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated")
        warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


def _task(name: str, prop: str, dataset: str, rmsd: float, mean: float, references) -> dict:
    spec = {"_target_": "fairchem.core.units.mlip_unit.mlip_unit.OutputSpec"}
    task = {
        "_target_": "fairchem.core.units.mlip_unit.mlip_unit.Task",
        "name": name,
        "level": "system" if prop == "energy" else "atom",
        "property": prop,
        "out_spec": {**spec, "dim": [1] if prop == "energy" else [3], "dtype": "float32"},
        "normalizer": {
            "_target_": "fairchem.core.modules.normalization.normalizer.Normalizer",
            "mean": mean,
            "rmsd": rmsd,
        },
        "datasets": [dataset],
    }
    if references is not None:
        task["element_references"] = {
            "_target_": "fairchem.core.modules.normalization.element_references.ElementReferences",
            "element_references": {"_target_": "torch.DoubleTensor", "_args_": [references]},
        }
    return task


def write_moe_checkpoint(
    path, seed: int = 0, head: str = "experts", energy_mean: float = 0.0, model_id=None, **change
):
    """A fairchem inference checkpoint of a small UMA mixture-of-experts model with random
    weights, built and saved as fairchem builds and saves one (hydra configuration,
    ``HydraModel``, its EMA as ``ema_state_dict``, tasks with normalizers and element
    references per dataset): what ``MLIPPredictUnit`` and ``Uma.from_checkpoint`` read.

    ``change`` replaces backbone options; ``energy_mean`` is the energy normalizers' mean
    (uma's are 0). Each dataset's energy is scaled by its own rmsd (the forces by the same)
    and shifted by random element references of up to -10 eV.
    """
    import hydra
    from fairchem.core.units.mlip_unit.api.inference import MLIPInferenceCheckpoint

    model_config = {
        "_target_": "fairchem.core.models.base.HydraModel",
        "backbone": {**MOE_BACKBONE, **change},
        "heads": {"efs": MOE_HEADS[head]},
        "pass_through_head_outputs": True,
        "otf_graph": True,
    }
    if model_id is not None:
        model_config["model_id"] = model_id
    rng = np.random.default_rng(seed)
    with _fairchem_quietly(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = hydra.utils.instantiate(copy.deepcopy(model_config))
    ema = torch.optim.swa_utils.AveragedModel(model)
    tasks = []
    for k, dataset in enumerate(sorted(MOE_TASKS)):
        rmsd = 1.0 + 0.25 * k
        references = [0.0, *(-10.0 * rng.random(99)).tolist()]
        tasks.append(_task(f"{dataset}_energy", "energy", dataset, rmsd, energy_mean, references))
        tasks.append(_task(f"{dataset}_forces", "forces", dataset, rmsd, 0.0, None))
    torch.save(
        MLIPInferenceCheckpoint(
            model_config=model_config,
            model_state_dict=model.state_dict(),
            ema_state_dict=ema.state_dict(),
            tasks_config=tasks,
        ),
        path,
    )
    return path


def predict_unit(path, dtype=torch.float64):
    """fairchem's own ``MLIPPredictUnit`` on the checkpoint (CPU, general backend, no
    merging of experts)."""
    from fairchem.core.units.mlip_unit.api.inference import InferenceSettings
    from fairchem.core.units.mlip_unit.predict import MLIPPredictUnit

    settings = InferenceSettings(
        base_precision_dtype=dtype, activation_checkpointing=False, merge_mole=False
    )
    with _fairchem_quietly():
        return MLIPPredictUnit(str(path), device="cpu", inference_settings=settings)


def fairchem_predict(unit, system: System, task: str, charge: int = 0, spin: int = 0) -> dict:
    """``FAIRChemCalculator`` with the predict unit on the whole periodic ``system``:
    energy, forces and the virial ``-V stress``."""
    from ase import Atoms
    from fairchem.core.calculate.ase_calculator import FAIRChemCalculator

    atoms = Atoms(
        [system.elements[s] for s in system.species],
        positions=system.positions,
        cell=system.cell,
        pbc=system.pbc,
    )
    atoms.info.update(charge=charge, spin=spin)
    atoms.calc = FAIRChemCalculator(unit, task_name=task)
    with _fairchem_quietly():
        stress = atoms.get_stress(voigt=False)
    return {
        "energy": float(atoms.get_potential_energy()),
        "forces": np.array(atoms.get_forces(), dtype=np.float64),
        "virial": -system.volume * np.array(stress, dtype=np.float64),
    }
