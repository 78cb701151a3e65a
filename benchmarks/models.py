"""Models with random weights for the benchmark configurations in ``configs/`` (named there
as ``python: "../models.py:<function>"``): small ones for the CPU, and the released
foundation models' shapes (MACE-MP-0 medium and small, UMA-s) for GPU runs. Each is built
by the model package's own classes (mace-torch's ``ScaleShiftMACE``, fairchem's UMA
backbone) with seeded random weights, so that nothing is downloaded."""

from __future__ import annotations

import copy
import warnings


def small_mace(dtype: str = "float32", num_interactions: int = 2, kernels: str = "auto"):
    """A small random ScaleShiftMACE for Ar/Kr (r_max 4, 8x0e+8x1o, max_ell 1, correlation
    2), the architecture of the tests' MACE."""
    return _mace(
        dtype,
        kernels,
        r_max=4.0,
        num_bessel=4,
        max_ell=1,
        num_interactions=num_interactions,
        hidden_irreps="8x0e+8x1o",
        MLP_irreps="8x0e",
        atomic_energies=[-0.5, -0.7],
        avg_num_neighbors=12.0,
        atomic_numbers=[18, 36],
        correlation=2,
        radial_MLP=[16, 16],
        atomic_inter_scale=1.3,
        atomic_inter_shift=0.1,
    )


def cu_mace(dtype: str = "float64", num_interactions: int = 1, kernels: str = "auto"):
    """A random ScaleShiftMACE for Cu (r_max 5, 16x0e+16x1o, max_ell 3, correlation 3), the
    model of docs/performance.md's CPU step-against-model tables."""
    return _mace(
        dtype,
        kernels,
        r_max=5.0,
        num_bessel=8,
        max_ell=3,
        num_interactions=num_interactions,
        hidden_irreps="16x0e+16x1o",
        MLP_irreps="16x0e",
        atomic_energies=[-3.7],
        avg_num_neighbors=44.0,
        atomic_numbers=[29],
        correlation=3,
        radial_MLP=[64, 64, 64],
        atomic_inter_scale=1.0,
        atomic_inter_shift=0.0,
    )


#: Atomic numbers of MACE-MP-0 (and OMAT-0, MPA-0): H to Ac.
MP_ATOMIC_NUMBERS = list(range(1, 90))

#: MACE-MP-0 medium's hyperparameters (``2023-12-03-mace-128-L1``; OMAT-0 and MPA-0 medium
#: add ZBL pair repulsion and the Agnesi transform, see :func:`mp_medium_mace`): r_max 6 A,
#: 10 Bessel functions, 2 residual interaction blocks, hidden irreps 128x0e+128x1o, max_ell
#: 3, correlation 3 on the full Clebsch-Gordan basis (the released models predate the
#: reduced one), radial MLP [64, 64, 64], readout MLP 16x0e, 89 elements, and its training
#: set's mean number of neighbors within r_max (a bcc metal has 64 within 6 A): 4,688,656
#: parameters, the released file's count (MP-0 small: 3,847,696). E0s, scale and shift are
#: seeded random numbers.
MP_MEDIUM = {
    "r_max": 6.0,
    "num_bessel": 10,
    "max_ell": 3,
    "num_interactions": 2,
    "hidden_irreps": "128x0e+128x1o",
    "MLP_irreps": "16x0e",
    "avg_num_neighbors": 61.96,
    "atomic_numbers": MP_ATOMIC_NUMBERS,
    "correlation": 3,
    "use_reduced_cg": False,
    "radial_MLP": [64, 64, 64],
}

#: MACE-MP-0 small: the medium one with scalar hidden features only (128x0e).
MP_SMALL = {**MP_MEDIUM, "hidden_irreps": "128x0e"}

#: MACE-OMAT-0 / MPA-0 medium on top of MP-0 medium: ZBL pair repulsion, Agnesi transform.
OMAT = {"pair_repulsion": True, "distance_transform": "Agnesi"}


def mp_medium_mace(
    dtype: str = "float32",
    kernels: str = "auto",
    omat: bool = False,
    pair_chunk: int = 0,
    compile_blocks: bool = False,
):
    """A random ScaleShiftMACE of MACE-MP-0 medium's shape (:data:`MP_MEDIUM`, 89
    elements); ``omat``: MACE-OMAT-0 / MPA-0 medium's (with :data:`OMAT`); ``pair_chunk``
    and ``compile_blocks``: the potential's options."""
    hyper = mace_hyperparameters(MP_MEDIUM, omat)
    return _mace(dtype, kernels, pair_chunk=pair_chunk, compile_blocks=compile_blocks, **hyper)


def small_mace_128(dtype: str = "float32", kernels: str = "auto", omat: bool = False):
    """A random ScaleShiftMACE of MACE-MP-0 small's shape (:data:`MP_SMALL`: 128x0e)."""
    return _mace(dtype, kernels, **mace_hyperparameters(MP_SMALL, omat))


def mace_hyperparameters(shape: dict, omat: bool = False, seed: int = 0) -> dict:
    """``shape`` (:data:`MP_MEDIUM`, :data:`MP_SMALL`) with seeded E0s of -0.5 to -10 eV,
    scale and shift: mace-torch's ScaleShiftMACE arguments as :func:`mace_network` takes
    them."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hyper = {**shape, **(OMAT if omat else {})}
    return hyper | {
        "atomic_energies": (-rng.uniform(0.5, 10.0, len(shape["atomic_numbers"]))).tolist(),
        "atomic_inter_scale": float(rng.uniform(0.6, 1.0)),
        "atomic_inter_shift": float(rng.uniform(-0.1, 0.1)),
    }


def _mace(dtype: str, kernels: str, *, pair_chunk: int = 0, compile_blocks: bool = False, **hyper):
    """:func:`mace_network` of ``hyper`` as this package's MACE potential."""
    from nvalchemi_lammps.potentials.mace import Mace

    network = mace_network(hyper)
    with warnings.catch_warnings():  # e3nn and mace-torch script parts: TorchScript warns
        warnings.simplefilter("ignore")
        return Mace.from_model(
            network,
            dtype=dtype,
            kernels=kernels,
            pair_chunk=pair_chunk,
            compile_blocks=compile_blocks,
        )


def mace_network(hyper: dict):
    """mace-torch's ScaleShiftMACE (residual interaction blocks, SiLU gate, polynomial
    cutoff of order 5, seed 0) with ``hyper``, in float64: the network the MACE functions
    here wrap (for a reference evaluation by mace-torch itself)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _scale_shift_mace(dict(hyper))


def _scale_shift_mace(hyper: dict):
    import numpy as np
    import torch

    with torch.serialization.safe_globals([slice]):  # e3nn's constants, loaded at import
        from e3nn import o3
    from nvalchemi_lammps.potentials.mace._mace_torch import weights_only_load_kept

    with weights_only_load_kept():
        from mace import modules
    interaction = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    hyper |= {
        "hidden_irreps": o3.Irreps(hyper["hidden_irreps"]),
        "MLP_irreps": o3.Irreps(hyper["MLP_irreps"]),
        "atomic_energies": np.array(hyper["atomic_energies"]),
        "num_elements": len(hyper["atomic_numbers"]),
    }
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # mace-torch makes its buffers in this dtype
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            network = modules.ScaleShiftMACE(
                num_polynomial_cutoff=5,
                interaction_cls=interaction,
                interaction_cls_first=interaction,
                gate=torch.nn.functional.silu,
                **hyper,
            ).eval()
    finally:
        torch.set_default_dtype(previous)
    return network


def random_aimnet2(elements: list[str], dtype: str = "float32"):
    """AIMNet2 with random weights from aimnet's packaged architecture."""
    from nvalchemi_lammps.potentials.aimnet2 import AIMNet2

    return AIMNet2.random_weights(elements, seed=0, dtype=dtype)


#: The datasets (tasks) of uma-s-1p1, each its own dataset embedding; one energy head for all.
UMA_TASKS = ("oc20", "omat", "omol", "odac", "omc")

#: uma-s-1p1's backbone (fairchem's configs/uma/training_release: backbone K4L2 without the
#: solvent embedding of 1.2, 32 experts): eSCN-MD with a mixture of linear experts in the
#: SO(2) convolutions, 4 blocks of 128 channels, lmax = mmax = 2, cutoff 6 A, 64 Gaussians,
#: spectral feed-forward, random charge / spin embeddings, a dataset embedding, the
#: experts mixed by the composition, charge, spin and task (softmax), model version 1.1.
UMA_S = {
    "model": "fairchem.core.models.uma.escn_moe.eSCNMDMoeBackbone",
    "max_num_elements": 100,
    "sphere_channels": 128,
    "lmax": 2,
    "mmax": 2,
    "max_neighbors": 300,
    "cutoff": 6.0,
    "edge_channels": 128,
    "distance_function": "gaussian",
    "num_distance_basis": 64,
    "num_layers": 4,
    "hidden_channels": 128,
    "norm_type": "rms_norm_sh",
    "act_type": "gate",
    "ff_type": "spectral",
    "chg_spin_emb_type": "rand_emb",
    "dataset_mapping": {task: task for task in UMA_TASKS},
    "num_experts": 32,
    "use_composition_embedding": True,
    "moe_expert_coefficient_norm": "softmax",
    "moe_type": "so2",
    "model_version": 1.1,
}


def uma_s(
    elements: list[str] = ("O", "H"),
    composition: dict[str, int] | None = None,
    task: str = "omol",
    charge: int = 0,
    spin: int = 1,
    dtype: str = "float32",
    seed: int = 0,
):
    """A random UMA of uma-s-1p1's shape (:data:`UMA_S`) with its 32 experts merged into
    one backbone for ``composition`` (atoms per element; default: water, 2 H per O), net
    ``charge``, ``spin`` multiplicity and ``task``, as fairchem's predict unit merges them
    (``merge_mole``) for a system whose composition stays: a plain eSCN-MD backbone of
    uma-s's width and depth, valid for any system of the same proportions (the experts
    are mixed by the mean composition). The energy head is one ``MLP_EFS_Head`` for every
    task, as uma-s-1p1's. :func:`uma_s_experts` is the model before merging."""
    experts = uma_s_experts(elements, task, spin, dtype, seed)
    return merge_experts(experts, composition or {"H": 2, "O": 1}, charge)


def uma_s_experts(
    elements: list[str] = ("O", "H"),
    task: str = "omol",
    spin: int = 1,
    dtype: str = "float32",
    seed: int = 0,
):
    """uma-s-1p1's mixture of experts with random weights (fairchem's initialization,
    ``seed``): the experts are mixed at every evaluation, by the composition summed over
    ranks (``pair_style nvalchemi`` only: the other doors give the model no all-reduce)."""
    from nvalchemi_lammps.potentials.uma import Uma

    return Uma.random_weights(UMA_S, list(elements), task, seed=seed, spin=spin, dtype=dtype)


def merge_experts(experts, composition: dict[str, int], charge: int = 0):
    """``experts`` (a :func:`uma_s_experts`) with its experts merged for ``composition``
    (atoms per element) and ``charge``, by fairchem's ``eSCNMDMoeBackbone.merge_MOLE_model``
    (each expert layer becomes the linear layer of the mixed weights): a plain eSCN-MD
    model with the same head, spin and task."""
    import torch
    from ase.data import atomic_numbers

    from nvalchemi_lammps.potentials.uma import Uma

    numbers = [atomic_numbers[e] for e, count in composition.items() for _ in range(count)]
    data = {
        "charge": torch.tensor([charge]),
        "spin": torch.tensor([experts.spin]),
        "dataset": [experts.task],
        "atomic_numbers": torch.tensor(numbers),
        "batch": torch.zeros(len(numbers), dtype=torch.int64),
    }
    moe = copy.deepcopy(experts.backbone)
    previous = torch.get_default_dtype()
    # fairchem makes the merged layers and backbone in torch's default dtype: the model's
    torch.set_default_dtype(experts.spec.torch_dtype)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")
            merged = moe.merge_MOLE_model(data)
    finally:
        torch.set_default_dtype(previous)
    config = experts.config()
    # the plain backbone's options: those fairchem handed from the experts' to eSCNMDBackbone
    config["backbone"] = {k: v for k, v in config["backbone"].items() if k in moe.parent_kwargs}
    plain = Uma.from_config(config)
    state = {f"backbone.{k}": v for k, v in merged.state_dict().items()}
    state |= {f"energy_block.{k}": v for k, v in experts.energy_block.state_dict().items()}
    plain.load_state_dict(state)
    return plain
