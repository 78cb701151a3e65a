"""Small random mace-torch models for the tests (importing this module imports
mace-torch: skip first where it may be missing)."""

from __future__ import annotations

import numpy as np
import torch

from nvalchemi_lammps.potentials.mace import _mace_torch

ELEMENTS = ("Ar", "Kr")
R_MAX = 4.0


def random_mace(
    kind: str = "ScaleShiftMACE",
    interaction: str = "RealAgnosticResidualInteractionBlock",
    num_interactions: int = 2,
    seed: int = 0,
    **options,
) -> torch.nn.Module:
    """A small mace-torch model with random weights, in float64."""
    mm = _mace_torch._mace()
    from e3nn import o3

    kwargs = {
        "r_max": R_MAX,
        "num_bessel": 4,
        "num_polynomial_cutoff": 5,
        "max_ell": 1,
        "interaction_cls": mm.interaction_classes[interaction],
        "interaction_cls_first": mm.interaction_classes[interaction],
        "num_interactions": num_interactions,
        "num_elements": 2,
        "hidden_irreps": o3.Irreps("8x0e+8x1o"),
        "MLP_irreps": o3.Irreps("8x0e"),
        "atomic_energies": np.array([-0.5, -0.7]),
        "avg_num_neighbors": 12.0,
        "atomic_numbers": [18, 36],
        "correlation": 2,
        "gate": torch.nn.functional.silu,
        "radial_MLP": [16, 16],
    }
    cls = mm.ScaleShiftMACE if kind == "ScaleShiftMACE" else mm.MACE
    if kind == "ScaleShiftMACE":
        kwargs.update(atomic_inter_scale=1.3, atomic_inter_shift=0.1)
    kwargs.update(options)
    kwargs["num_elements"] = len(kwargs["atomic_numbers"])
    torch.manual_seed(seed)
    with _mace_torch._quiet_torchscript(), _mace_torch._default_dtype(torch.float64):
        model = cls(**kwargs)
    return model.eval()


#: name -> mace-torch model options; "scale_shift" and "plain" are the common variants.
VARIANTS = {
    "scale_shift": {"kind": "ScaleShiftMACE", "pair_repulsion": True},
    "plain": {"kind": "MACE", "interaction": "RealAgnosticInteractionBlock", "num_interactions": 3},
}


# --- the architectures of MACE's foundation-model families ---------------------------------

#: Atomic numbers of the MACE-MP/MPA/OMAT families (H to Ac) and of MACE-OFF23.
MP_ELEMENTS = list(range(1, 90))
OFF_ELEMENTS = [1, 6, 7, 8, 9, 15, 16, 17, 35, 53]

_MP = {
    "kind": "ScaleShiftMACE",
    "r_max": 6.0,
    "num_bessel": 10,
    "max_ell": 3,
    "correlation": 3,
    "MLP_irreps": "16x0e",
    "radial_MLP": [64, 64, 64],
    "avg_num_neighbors": 61.96,
    "atomic_numbers": MP_ELEMENTS,
}
_OFF = {**_MP, "r_max": 5.0, "num_bessel": 8, "avg_num_neighbors": 23.0}
_OFF["atomic_numbers"] = OFF_ELEMENTS
_MPA = {**_MP, "pair_repulsion": True, "distance_transform": "Agnesi"}

#: name -> mace-torch options of a foundation-model family as published by mace-torch's
#: authors (hyperparameters of the model files, which this environment cannot download:
#: random weights of the same architecture stand in for them). Irreps are strings here.
FAMILIES = {
    "mp-small": {**_MP, "hidden_irreps": "128x0e"},  # MACE-MP-0 small
    "mp-medium": {**_MP, "hidden_irreps": "128x0e+128x1o"},  # MACE-MP-0 medium
    "mp-large": {**_MP, "hidden_irreps": "128x0e+128x1o+128x2e"},  # MACE-MP-0 large
    # MACE-MP-0b3, MACE-MPA-0, MACE-OMAT-0, MACE-MATPES (fine-tunes of OMAT-0): ZBL pair
    # repulsion and Agnesi distance transform
    "mpa-medium": {**_MPA, "hidden_irreps": "128x0e+128x1o"},
    # MACE-MP-0b2 "density" models
    "mp-0b2-density": {
        **_MPA,
        "hidden_irreps": "128x0e+128x1o",
        "interaction": "RealAgnosticDensityResidualInteractionBlock",
    },
    "off-small": {**_OFF, "hidden_irreps": "96x0e"},  # MACE-OFF23 small
    "off-medium": {**_OFF, "hidden_irreps": "128x0e+128x1o"},  # MACE-OFF23 medium
    "off-large": {**_OFF, "hidden_irreps": "192x0e+192x1o+192x2e"},  # MACE-OFF23 large
    # a multi-head fine-tune of MACE-MP (mace-torch's --multiheads_finetuning): the
    # pretraining head kept next to the fine-tuned one
    "mp-finetune-multihead": {
        **_MPA,
        "hidden_irreps": "128x0e+128x1o",
        "heads": ["pt_head", "Default"],
    },
    # MACE-MH-0/1: non-linear interaction blocks, edge irreps, element-agnostic product,
    # bias readouts, several heads
    "mh": {
        **_MPA,
        "hidden_irreps": "128x0e+128x1o",
        "interaction": "RealAgnosticResidualNonLinearInteractionBlock",
        "edge_irreps": "128x0e+128x1o+128x2e",
        "use_edge_irreps_first": True,
        "use_agnostic_product": True,
        "readout_cls": "NonLinearBiasReadoutBlock",
        "use_last_readout_only": True,
        "heads": ["omat_pbe", "omol", "spice_wB97M", "matpes_r2scan"],
    },
}


def _channels(irreps: str, channels: int | None) -> str:
    if channels is None:
        return irreps
    return "+".join(f"{channels}x{term.split('x')[1]}" for term in irreps.split("+"))


def random_family(
    name: str, channels: int | None = None, elements: list[int] | None = None, seed: int = 0
) -> torch.nn.Module:
    """A random-weight model of family ``name`` (:data:`FAMILIES`), float64; ``channels``
    and ``elements`` shrink it for tests (the same blocks and options)."""
    from e3nn import o3

    mm = _mace_torch._mace()
    options = dict(FAMILIES[name])
    if elements is not None:
        options["atomic_numbers"] = elements
    numbers = options["atomic_numbers"]
    heads = options.get("heads", ["Default"])
    rng = np.random.default_rng(seed)
    options["num_elements"] = len(numbers)
    energies = -rng.uniform(0.5, 5.0, size=(len(heads), len(numbers)))
    options["atomic_energies"] = energies if len(heads) > 1 else energies[0]
    options["atomic_inter_scale"] = rng.uniform(0.8, 1.2, size=len(heads))
    options["atomic_inter_shift"] = rng.uniform(-0.1, 0.1, size=len(heads))
    for key in ("hidden_irreps", "edge_irreps"):
        if key in options:
            options[key] = o3.Irreps(_channels(options[key], channels))
    options["MLP_irreps"] = o3.Irreps(options["MLP_irreps"])
    if "readout_cls" in options:
        options["readout_cls"] = mm.readout_classes[options["readout_cls"]]
    if channels is not None:
        options["radial_MLP"] = [2 * channels] * 3
    return random_mace(seed=seed, **options)


def mace_forward(
    model: torch.nn.Module, system, head: str = "Default", dtype=torch.float64
) -> dict[str, np.ndarray]:
    """mace-torch on ``system``: its AtomicData, its neighbor list, its forward (inputs in
    ``dtype``, the model's)."""
    import ase

    _mace_torch._mace()
    with _mace_torch._quiet_torchscript():
        from mace import data as mace_data
        from mace.tools import torch_geometric
        from mace.tools.utils import AtomicNumberTable

    atoms = ase.Atoms(
        symbols=[system.elements[s] for s in system.species],
        positions=system.positions,
        cell=system.cell,
        pbc=system.pbc,
    )
    with _mace_torch._default_dtype(dtype):
        config = mace_data.config_from_atoms(atoms, head_name=head)
        table = AtomicNumberTable([int(z) for z in model.atomic_numbers])
        data = mace_data.AtomicData.from_config(
            config, z_table=table, cutoff=float(model.r_max), heads=model.heads
        )
        batch = torch_geometric.batch.Batch.from_data_list([data]).to_dict()
        out = model(batch, compute_force=True, compute_virials=True, compute_stress=True)
    return {
        "energy": float(out["energy"].detach()[0]),
        "atom_energies": out["node_energy"].detach().numpy(),
        "forces": out["forces"].detach().numpy(),
        "virial": out["virials"][0].detach().numpy(),
        "stress": out["stress"][0].detach().numpy(),
    }
