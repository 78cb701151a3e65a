"""Small random mace-torch models for the tests (importing this module imports
mace-torch: skip first where it may be missing)."""

from __future__ import annotations

import numpy as np
import torch

from nvalchemi_lammps.potentials import mace as mace_module

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
    mm = mace_module._mace()
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
    torch.manual_seed(seed)
    with mace_module._quiet_torchscript(), mace_module._default_dtype(torch.float64):
        model = cls(**kwargs)
    return model.eval()


#: name -> mace-torch model options; "scale_shift" and "plain" are the common variants.
VARIANTS = {
    "scale_shift": {"kind": "ScaleShiftMACE", "pair_repulsion": True},
    "plain": {"kind": "MACE", "interaction": "RealAgnosticInteractionBlock", "num_interactions": 3},
}
