"""MACE hyperparameters <-> plain data: what a model file keeps of a mace-torch model
(:func:`model_config`), and the network rebuilt from it (:func:`build_model`)."""

from __future__ import annotations

from typing import Any

import torch

from ..._quiet import without_torchscript_warnings as _quiet_torchscript
from ._kernels import _check_e3nn, _cueq_available
from ._mace_torch import _default_dtype, _mace
from ._tensor_product_splits import split_tensor_product_inputs

#: The mace-torch model classes whose forward this module reproduces.
MODEL_CLASSES = ("MACE", "ScaleShiftMACE")
#: Readout classes that take the arguments MACE's constructor passes to ``readout_cls``.
READOUT_CLASSES = ("NonLinearReadoutBlock", "NonLinearBiasReadoutBlock")

#: Keys of :meth:`Mace.config`'s ``model`` entry: MACE's constructor arguments as plain data
#: (irreps as strings, classes and the gate by name); ``class`` picks the model class.
_COMMON_KEYS = (
    "class",
    "r_max",
    "num_bessel",
    "num_polynomial_cutoff",
    "max_ell",
    "interaction_cls",
    "interaction_cls_first",
    "num_interactions",
    "num_elements",
    "hidden_irreps",
    "MLP_irreps",
    "atomic_energies",
    "avg_num_neighbors",
    "atomic_numbers",
    "correlation",
    "gate",
    "pair_repulsion",
    "apply_cutoff",
    "use_reduced_cg",
    "use_so3",
    "use_agnostic_product",
    "use_last_readout_only",
    "distance_transform",
    "edge_irreps",
    "use_edge_irreps_first",
    "radial_MLP",
    "radial_type",
    "heads",
    "readout_cls",
    "keep_last_layer_irreps",
)
_SCALE_SHIFT_KEYS = ("atomic_inter_scale", "atomic_inter_shift")


def _gate_name(module: Any, gates: dict[str, Any]) -> str:
    """Name in ``mace.modules.gate_dict`` of the activation of a readout's non-linearity."""
    acts = getattr(getattr(module, "non_linearity", None), "acts", None)
    if not acts:
        return "silu"  # no non-linear readout: the gate is never used
    function = getattr(acts[0], "f", acts[0])
    for name, gate in gates.items():
        if gate is function:
            return name
    raise ValueError(
        f"unsupported MACE readout activation {function!r} "
        f"(supported: {', '.join(n for n in gates if n != 'None')})"
    )


def _correlation(product: Any) -> int:
    contraction = product.symmetric_contractions.contractions[0]
    return len(contraction.weights) + 1


def _check_model_class(model: Any) -> None:
    mm = _mace()
    if type(model) not in (mm.MACE, mm.ScaleShiftMACE):
        raise ValueError(
            f"unsupported MACE model class {type(model).__name__} "
            f"(supported: {', '.join(MODEL_CLASSES)})"
        )


def model_config(model: torch.nn.Module) -> dict[str, Any]:
    """The constructor arguments of a mace-torch ``MACE``/``ScaleShiftMACE`` as plain data.

    :raises ValueError: a model class, block class or option this module cannot rebuild
    """
    mm = _mace()
    from e3nn import o3

    kind = type(model).__name__
    _check_model_class(model)
    if hasattr(model, "joint_embedding") or hasattr(model, "embedding_readout"):
        raise ValueError("MACE models with extra embeddings (embedding_specs) are not supported")
    _check_e3nn(model)
    interactions = {cls: name for name, cls in mm.interaction_classes.items()}
    for block in model.interactions:
        if type(block) not in interactions:
            raise ValueError(
                f"unsupported MACE interaction block {type(block).__name__} "
                f"(supported: {', '.join(mm.interaction_classes)})"
            )
    readout = type(model.readouts[-1]).__name__
    if readout not in READOUT_CLASSES:
        # models with one interaction (or only linear readouts) never build readout_cls
        readout = READOUT_CLASSES[0]
    heads = list(getattr(model, "heads", None) or ["Default"])
    num_interactions = int(model.num_interactions)
    hidden_irreps = o3.Irreps(str(model.products[0].linear.irreps_out))
    last_irreps = o3.Irreps(str(model.products[-1].linear.irreps_out))
    mlp_irreps = o3.Irreps(str(getattr(model.readouts[-1], "hidden_irreps", "1x0e")))
    mlp_scalars = max(1, mlp_irreps.count((0, 1)) // len(heads))
    radial = model.radial_embedding
    radial_types = {
        "BesselBasis": "bessel",
        "GaussianBasis": "gaussian",
        "ChebychevBasis": "chebyshev",
    }
    transform = getattr(radial, "distance_transform", None)
    transforms = {"AgnesiTransform": "Agnesi", "SoftTransform": "Soft"}
    edge_irreps = getattr(model, "edge_irreps", None)
    config: dict[str, Any] = {
        "class": kind,
        "r_max": float(model.r_max),
        "num_bessel": int(radial.out_dim),
        "num_polynomial_cutoff": int(radial.cutoff_fn.p),
        "max_ell": int(model.spherical_harmonics._lmax),
        "interaction_cls": interactions[type(model.interactions[-1])],
        "interaction_cls_first": interactions[type(model.interactions[0])],
        "num_interactions": num_interactions,
        "num_elements": len(model.atomic_numbers),
        "hidden_irreps": str(hidden_irreps),
        "MLP_irreps": f"{mlp_scalars}x0e",
        "atomic_energies": model.atomic_energies_fn.atomic_energies.tolist(),
        "avg_num_neighbors": float(model.interactions[0].avg_num_neighbors),
        "atomic_numbers": [int(z) for z in model.atomic_numbers],
        "correlation": [_correlation(p) for p in model.products],
        "gate": _gate_name(model.readouts[-1], mm.gate_dict),
        "pair_repulsion": hasattr(model, "pair_repulsion_fn"),
        "apply_cutoff": bool(getattr(model, "apply_cutoff", True)),
        # the basis built, not the one asked for (see _kernels._CUEQ_HINT)
        "use_reduced_cg": bool(getattr(model, "use_reduced_cg", False)) and _cueq_available(),
        "use_so3": bool(getattr(model, "use_so3", False)),
        "use_agnostic_product": bool(getattr(model, "use_agnostic_product", False)),
        "use_last_readout_only": bool(getattr(model, "use_last_readout_only", False)),
        "distance_transform": transforms.get(type(transform).__name__, "None"),
        "edge_irreps": None if edge_irreps is None else str(edge_irreps),
        "use_edge_irreps_first": bool(getattr(model, "use_edge_irreps_first", False)),
        "radial_MLP": [int(h) for h in _radial_mlp(model)],
        "radial_type": radial_types.get(type(radial.bessel_fn).__name__, "bessel"),
        "heads": heads,
        "readout_cls": readout,
        # the last product keeps the full hidden irreps only with this option
        "keep_last_layer_irreps": (
            num_interactions > 1
            and last_irreps == hidden_irreps
            and hidden_irreps != o3.Irreps(str(hidden_irreps[0]))
        ),
    }
    if kind == "ScaleShiftMACE":
        config["atomic_inter_scale"] = model.scale_shift.scale.tolist()
        config["atomic_inter_shift"] = model.scale_shift.shift.tolist()
    return config


def _radial_mlp(model: torch.nn.Module) -> list[int]:
    from mace.tools.scripts_utils import extract_radial_MLP

    return list(extract_radial_MLP(model))


def _check_keys(config: dict[str, Any]) -> None:
    kind = config.get("class")
    if kind not in MODEL_CLASSES:
        raise ValueError(
            f"unsupported MACE model class {kind} (supported: {', '.join(MODEL_CLASSES)})"
        )
    allowed = set(_COMMON_KEYS) | (set(_SCALE_SHIFT_KEYS) if kind == "ScaleShiftMACE" else set())
    unknown, missing = sorted(set(config) - allowed), sorted(allowed - set(config))
    if unknown or missing:
        raise ValueError(
            f"MACE model configuration: unknown key(s) {unknown or 'none'}, "
            f"missing key(s) {missing or 'none'}"
        )


def build_model(config: dict[str, Any]) -> torch.nn.Module:
    """A mace-torch model from :func:`model_config`'s plain data (random weights, float64),
    its e3nn tensor products splitting each input once (:mod:`._tensor_product_splits`).

    :raises ValueError: unknown keys, or a class or gate this module does not rebuild
    """
    mm = _mace()
    from e3nn import o3

    _check_keys(config)
    config = dict(config)
    kind = config.pop("class")
    for key in ("interaction_cls", "interaction_cls_first"):
        if config[key] not in mm.interaction_classes:
            raise ValueError(
                f"unsupported MACE {key} {config[key]} "
                f"(supported: {', '.join(mm.interaction_classes)})"
            )
        config[key] = mm.interaction_classes[config[key]]
    if config["readout_cls"] not in READOUT_CLASSES:
        raise ValueError(
            f"unsupported MACE readout_cls {config['readout_cls']} "
            f"(supported: {', '.join(READOUT_CLASSES)})"
        )
    config["readout_cls"] = mm.readout_classes[config["readout_cls"]]
    if config["gate"] not in mm.gate_dict:
        raise ValueError(
            f"unsupported MACE gate {config['gate']} (supported: {', '.join(mm.gate_dict)})"
        )
    config["gate"] = mm.gate_dict[config["gate"]]
    for key in ("hidden_irreps", "MLP_irreps", "edge_irreps"):
        if config[key] is not None:
            config[key] = o3.Irreps(config[key])
    import numpy as np

    config["atomic_energies"] = np.array(config["atomic_energies"], dtype=np.float64)
    if kind == "ScaleShiftMACE":
        for key in _SCALE_SHIFT_KEYS:
            config[key] = np.array(config[key], dtype=np.float64)
    cls = mm.ScaleShiftMACE if kind == "ScaleShiftMACE" else mm.MACE
    # the random initial weights (replaced by the real ones) leave torch's generator alone
    with _quiet_torchscript(), _default_dtype(torch.float64), torch.random.fork_rng(devices=[]):
        network = cls(**config)
        split_tensor_product_inputs(network)
    return network


def _head_index(heads: list[str], head: str | None) -> int:
    """Which head to evaluate: the named one; the only one; else the one called default."""
    if head is not None:
        if head not in heads:
            raise ValueError(f"head {head} not in the MACE model (heads: {', '.join(heads)})")
        return heads.index(head)
    if len(heads) == 1:
        return 0
    default = [k for k, h in enumerate(heads) if h.lower() == "default"]
    if not default:
        raise ValueError(
            f"this MACE model has several heads ({', '.join(heads)}): choose one with head"
        )
    return default[0]


def _element_symbols(atomic_numbers: list[int]) -> tuple[str, ...]:
    from ase.data import chemical_symbols

    return tuple(chemical_symbols[z] for z in atomic_numbers)
