"""Models with random weights for the benchmark configurations in ``configs/`` (named there
as ``python: "../models.py:<function>"``)."""

from __future__ import annotations

import os
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


def _mace(dtype: str, kernels: str, **hyper):
    """mace-torch's ScaleShiftMACE (residual interaction blocks, SiLU gate, seed 0) with
    ``hyper``, as this package's MACE potential."""
    with warnings.catch_warnings():  # e3nn and mace-torch script parts: TorchScript warns
        warnings.simplefilter("ignore")
        return _scale_shift_mace(dtype, kernels, hyper)


def _scale_shift_mace(dtype: str, kernels: str, hyper: dict):
    import numpy as np
    import torch

    from nvalchemi_lammps.potentials.mace import Mace

    with torch.serialization.safe_globals([slice]):  # e3nn's constants, loaded at import
        from e3nn import o3
    was = os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    from mace import modules  # sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1: put back below

    if was is None:
        os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    interaction = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    hyper |= {
        "hidden_irreps": o3.Irreps(hyper["hidden_irreps"]),
        "MLP_irreps": o3.Irreps(hyper["MLP_irreps"]),
        "atomic_energies": np.array(hyper["atomic_energies"]),
        "num_elements": len(hyper["atomic_numbers"]),
    }
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # mace-torch makes its buffers in this dtype
    torch.manual_seed(0)
    try:
        network = modules.ScaleShiftMACE(
            num_polynomial_cutoff=5,
            interaction_cls=interaction,
            interaction_cls_first=interaction,
            gate=torch.nn.functional.silu,
            **hyper,
        ).eval()
        return Mace.from_model(network, dtype=dtype, kernels=kernels)
    finally:
        torch.set_default_dtype(previous)


def random_aimnet2(elements: list[str], dtype: str = "float32"):
    """AIMNet2 with random weights from aimnet's packaged architecture."""
    from nvalchemi_lammps.potentials.aimnet2 import AIMNet2

    return AIMNet2.random_weights(elements, seed=0, dtype=dtype)
