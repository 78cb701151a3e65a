"""Which kernels run a MACE network, e3nn's or cuEquivariance's, and the conversions
between the two by mace-torch's own converters (``mace.cli.convert_e3nn_cueq`` and
``convert_cueq_e3nn``). OpenEquivariance models are refused."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import torch

from ..._quiet import without_torchscript_warnings as _quiet_torchscript
from ..._quiet import without_warnings
from ._mace_torch import _default_dtype, _inference, _mace

#: Which kernels run the network: ``auto`` = cuEquivariance's on a CUDA device where
#: cuequivariance-torch and its CUDA kernels (cuequivariance-ops-torch) are installed,
#: e3nn's elsewhere; ``e3nn``; ``cuequivariance`` (on any device: on the CPU, or without the
#: CUDA kernels, cuEquivariance's pure-torch reference implementation).
KERNELS = ("auto", "e3nn", "cuequivariance")
#: mace-torch builds its symmetric contractions on the reduced Clebsch-Gordan basis exactly
#: where cuEquivariance is installed (``use_reduced_cg and CUET_AVAILABLE``), on the full
#: one elsewhere; weights of one basis do not fit the other (``U_matrix_3`` [9,9,9,5] vs
#: [9,9,9,11]). Model files record the basis the weights were made for.
_CUEQ_INSTALL = (
    "cuequivariance-torch: pip install cuequivariance-torch (and, for its CUDA kernels, "
    "cuequivariance-ops-torch-cu12 or -cu13)"
)
_CUEQ_HINT = (
    "its weights were made for cuEquivariance's reduced Clebsch-Gordan basis, which "
    "mace-torch builds only where cuequivariance is installed: pip install "
    "cuequivariance-torch (it runs on the CPU too)"
)


def _cueq_available() -> bool:
    """mace-torch found cuequivariance (and so builds the reduced basis when asked)."""
    _mace()
    from mace.modules import wrapper_ops

    return bool(getattr(wrapper_ops, "CUET_AVAILABLE", False))


def _cueq_kernels_available() -> bool:
    """cuEquivariance's CUDA kernels (cuequivariance-ops-torch) can be imported."""
    try:
        importlib.import_module("cuequivariance_ops_torch")
    except Exception:  # noqa: BLE001 - a broken install (missing CUDA libraries) is "no"
        return False
    return True


def _auto_uses_cuequivariance(device: torch.device) -> bool:
    """``kernels = "auto"``: cuEquivariance's kernels on a CUDA device where they are
    installed."""
    return device.type == "cuda" and _cueq_available() and _cueq_kernels_available()


def _basis_mismatch(err: Exception) -> bool:
    """``load_state_dict``'s size mismatch of a symmetric contraction's basis."""
    return "U_matrix" in str(err) and "size mismatch" in str(err)


def _check_e3nn(model: Any) -> None:
    """``model`` runs on e3nn's kernels (what :func:`model_config` reads)."""
    if _uses_openequivariance(model):
        raise ValueError(_OEQ_REFUSED)
    for product in model.products:
        if not type(product.symmetric_contractions).__module__.startswith("mace."):
            raise ValueError(
                "this MACE model uses cuEquivariance kernels: convert it with Mace.from_model, "
                "which takes it back to e3nn's form"
            )


_OEQ_REFUSED = (
    "this MACE model uses OpenEquivariance kernels, which are not supported: convert it back "
    "to e3nn with mace-torch (mace.cli.convert_oeq_e3nn) or build it without oeq_config"
)


def _uses_openequivariance(model: Any) -> bool:
    for block in [*model.interactions, *model.products]:
        config = getattr(block, "oeq_config", None)
        if config is not None and getattr(config, "enabled", False):
            return True
    return False


def _uses_cuequivariance(model: Any) -> bool:
    """``model`` was built or converted with cuEquivariance (``cueq_config`` enabled)."""
    for block in [*model.interactions, *model.products]:
        config = getattr(block, "cueq_config", None)
        if config is not None and getattr(config, "enabled", False):
            return True
    return any(
        type(p.symmetric_contractions).__module__.startswith("cuequivariance")
        for p in model.products
    )


def _quiet_cuequivariance() -> contextlib.AbstractContextManager[None]:
    """cuEquivariance warns once per operation that it falls back to its pure-torch code
    where its CUDA kernels are not installed (``kernels = "cuequivariance"`` on the CPU asks
    for that), and mace-torch's converter copies buffers with ``torch.tensor(tensor)``."""
    return without_warnings(
        (r".*(cuequivariance_ops_torch is not available|backend is not available)", UserWarning),
        (r"To copy construct from a tensor", UserWarning),
    )


def _to_e3nn(model: torch.nn.Module) -> torch.nn.Module:
    """A cuEquivariance MACE model in e3nn's form, by mace-torch's converter, on the CPU in
    the model's dtype."""
    from mace.cli.convert_cueq_e3nn import run

    floating = [p.dtype for p in model.parameters() if p.is_floating_point()]
    with (
        _quiet_torchscript(),
        _quiet_cuequivariance(),
        _default_dtype(floating[0] if floating else torch.float64),
    ):
        return run(model, device="cpu", return_model=True).eval()


def _to_cuequivariance(network: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``network`` (e3nn's form) on cuEquivariance's kernels for ``device``, by mace-torch's
    converter: with its fused convolution on a CUDA device (the layout mace-torch's ML-IAP
    export uses, ``ir_mul``), all in ``network``'s dtype: cuEquivariance keeps its path
    coefficients as float64 buffers and casts each to the input's dtype at every call.

    :raises ValueError: the converter does not take this model
    """
    from mace.cli.convert_e3nn_cueq import run

    dtype = next(network.parameters()).dtype
    cuda = device.type == "cuda"
    on_device = torch.cuda.device(device) if cuda else contextlib.nullcontext()
    try:
        with on_device, _quiet_torchscript(), _quiet_cuequivariance(), _default_dtype(dtype):
            converted = run(
                network, device="cuda" if cuda else "cpu", return_model=True, layout="ir_mul"
            )
    except (NotImplementedError, KeyError, RuntimeError, ValueError) as err:
        raise ValueError(
            f"mace-torch's cuEquivariance converter does not take this MACE model ({err}); "
            'use kernels = "e3nn"'
        ) from None
    return _inference(converted.to(device=device, dtype=dtype))
