"""MACE (mace-torch) on a LocalGraph, with ghost features exchanged between layers.

The potential runs the blocks of a mace-torch ``MACE`` or ``ScaleShiftMACE`` itself, in the
order of their own ``forward``: E0s, node embedding, spherical harmonics and radial
embedding of the edges, then per layer an interaction block and a product basis block, then
the readouts (and scale/shift). With the exchange strategy (ghost rows refreshed from their
owners) the interaction blocks exchange the ghosts' features themselves, as in mace-torch's
LAMMPS ML-IAP path (``InteractionBlock.handle_lammps``, after ``linear_up``), through
``graph.comm``, and update the owned rows only. Otherwise (a single process, ``NoOpComm``;
the widened shell, whose exchange is the identity and whose ghosts compute their own
features) the potential calls ``graph.comm.forward_exchange`` on the node features between
layers, which is the same thing for the owned atoms because ``linear_up`` acts on each atom
on its own.

mace-torch is an optional dependency (``pip install 'nvalchemi-lammps[mace]'``), imported
only when a MACE model is built. The network runs on e3nn's kernels or on cuEquivariance's
(``kernels``): the weights are kept, saved and loaded in e3nn's form, and the cuEquivariance
network is made from them with mace-torch's own converter (``mace.cli.convert_e3nn_cueq``)
for the device the potential is moved to, then checked against the e3nn network. A model
built or converted with cuEquivariance is converted back to e3nn's form when exported
(``mace.cli.convert_cueq_e3nn``). OpenEquivariance models are refused.

The model file holds the MACE hyperparameters as plain data (:meth:`Mace.config`) and the
weights as tensors; loading it rebuilds the network from mace-torch's classes and never
unpickles anything. A mace-torch checkpoint, by contrast, is a pickled Python object:
:meth:`Mace.from_checkpoint` runs code from the file, so use it only on files you trust, and
export them once to a model file.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import os
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..contract import Comm, LocalGraph, ModelSpec, check_keys
from ._base import Potential, register_potential
from ._layers import (
    Rows,
    energy_rows,
    receiving_pairs,
    scattered,
    updated_rows,
    with_ghost_rows,
)
from ._quiet import without_torchscript_warnings as _quiet_torchscript
from ._quiet import without_warnings
from ._tensor_product_splits import split_tensor_product_inputs

#: The mace-torch model classes whose forward this module reproduces.
MODEL_CLASSES = ("MACE", "ScaleShiftMACE")
#: Readout classes that take the arguments MACE's constructor passes to ``readout_cls``.
READOUT_CLASSES = ("NonLinearReadoutBlock", "NonLinearBiasReadoutBlock")
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: Which kernels run the network: ``auto`` = cuEquivariance's on a CUDA device where
#: cuequivariance-torch and its CUDA kernels (cuequivariance-ops-torch) are installed,
#: e3nn's elsewhere; ``e3nn``; ``cuequivariance`` (on any device: on the CPU, or without the
#: CUDA kernels, cuEquivariance's pure-torch reference implementation).
KERNELS = ("auto", "e3nn", "cuequivariance")

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

_INSTALL_HINT = (
    "the mace potential needs mace-torch: pip install 'nvalchemi-lammps[mace]' "
    "(or pip install mace-torch)"
)
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


# --- importing mace-torch without its side effects -----------------------------------------


_MACE: Any = None


def _mace() -> Any:
    """``mace.modules``, imported once.

    Three side effects of importing mace-torch 0.3 are undone or avoided here:

    - ``mace/__init__.py`` sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` in the environment,
      which would make every later ``torch.load`` without an explicit ``weights_only`` in
      this process (and in any child process) unpickle arbitrary code: it is put back;
    - e3nn loads its constants with ``torch.load``; they contain ``slice`` objects, allowed
      here explicitly so that the load works without that environment variable;
    - mace prints a line to stdout when cuEquivariance is missing (it always is on CPU, and
      this module only uses e3nn): that line is dropped, anything else printed is kept.
    """
    global _MACE
    if _MACE is not None:
        return _MACE
    key = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    before = os.environ.get(key)
    captured = io.StringIO()
    try:
        with _quiet_torchscript(), contextlib.redirect_stdout(captured):
            with torch.serialization.safe_globals([slice]):
                # e3nn loads its constants at import: before mace changes the environment
                importlib.import_module("e3nn.o3")
            import mace.modules
            import mace.tools.compile  # Mace.prepare_compile
            import mace.tools.scripts_utils  # extract_radial_MLP
    except ImportError as err:
        raise ImportError(f"{_INSTALL_HINT} ({err})") from err
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
        for line in captured.getvalue().splitlines():
            if "Cuequivariance acceleration will be disabled" not in line:
                print(line, file=sys.stdout)
    _MACE = mace.modules
    return _MACE


#: held while a network is made on first use: mace-torch builds under torch's default dtype,
#: which is the process's, and ranks of one process (threads) share a potential
_BUILDING = threading.Lock()


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """mace-torch creates its buffers in torch's default dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


# --- MACE hyperparameters <-> plain data ----------------------------------------------------


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
        # the basis built, not the one asked for (see _CUEQ_HINT)
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


def _inference(network: torch.nn.Module) -> torch.nn.Module:
    """``network`` in eval mode with weights that need no gradient: the engine differentiates
    by the pair vectors only, and autograd records every operation on a weight that does."""
    for parameter in network.parameters():
        parameter.requires_grad_(False)
    return network.eval()


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


# --- the potential -------------------------------------------------------------------------


@register_potential
class Mace(Potential):
    """A mace-torch ``MACE`` or ``ScaleShiftMACE`` model.

    Per-atom energy = E0 of the atom's element + the readouts of every layer (+ ZBL pair
    repulsion where the model has it), scaled and shifted as ``ScaleShiftMACE`` does: the
    ``node_energy`` of mace-torch. Atoms of ``NULL`` types (species -1) have zero energy and
    no pairs. Energies are in eV and lengths in Angstrom (``units metal``); the cutoff is
    ``r_max`` and the model has ``num_interactions`` layers.

    Build one from a mace-torch model with :meth:`from_model` or from a checkpoint file with
    :meth:`from_checkpoint`; the constructor takes :meth:`config`'s plain data.

    :param model: MACE hyperparameters as plain data (:func:`model_config`): irreps as
        strings, block classes and the gate by name, ``class`` = ``MACE`` or
        ``ScaleShiftMACE``
    :param head: which head of a multi-head model to evaluate (default: the only head, or
        the one named ``default``)
    :param dtype: ``float64`` or ``float32``
    :param kernels: ``auto`` (default: cuEquivariance's kernels on a CUDA device where
        cuequivariance-torch and cuequivariance-ops-torch are installed, e3nn's elsewhere),
        ``e3nn`` or ``cuequivariance`` (on any device; :data:`KERNELS`)
    """

    name = "mace"

    def __init__(
        self,
        model: dict[str, Any],
        head: str | None = None,
        dtype: str = "float64",
        kernels: str = "auto",
    ) -> None:
        super().__init__()
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}; got '{dtype}'")
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {', '.join(KERNELS)}; got '{kernels}'")
        _check_keys(model)
        heads = list(model["heads"])
        self.head_index = _head_index(heads, head)
        self.model = _inference(build_model(model).to(_DTYPES[dtype]))
        self.spec = ModelSpec(
            elements=_element_symbols(list(model["atomic_numbers"])),
            cutoff=float(model["r_max"]),
            units="metal",
            dtype=dtype,
            layers=int(model["num_interactions"]),
        )
        self._config = {
            "model": copy.deepcopy(model),
            "head": heads[self.head_index],
            "dtype": dtype,
            "kernels": kernels,
        }
        if kernels == "cuequivariance" and not _cueq_available():
            raise ImportError(f"kernels = cuequivariance needs {_CUEQ_INSTALL}")
        # the network that runs: self.model, or its cuEquivariance conversion for the device,
        # made when first needed after the weights changed device or values (see
        # _select_kernels); not a submodule, so that weights and model files keep e3nn's form
        object.__setattr__(self, "_cueq", None)
        object.__setattr__(self, "_cueq_stale", True)

    def config(self) -> dict[str, Any]:
        return copy.deepcopy(self._config)

    @property
    def kernels(self) -> str:
        """The kernels the network runs on where its weights are now: ``e3nn`` or
        ``cuequivariance``."""
        return "e3nn" if self.network is self.model else "cuequivariance"

    @property
    def network(self) -> torch.nn.Module:
        """The mace-torch network that :meth:`forward` runs."""
        if self._cueq_stale:
            with _BUILDING:
                if self._cueq_stale:
                    self._select_kernels()
        return self.model if self._cueq is None else self._cueq

    def _apply(self, fn: Any, recurse: bool = True) -> Mace:
        """``to(device)`` and the like: the cuEquivariance network is made again, for the
        device the weights are on now (its kernels are chosen when it is built)."""
        super()._apply(fn, recurse)
        object.__setattr__(self, "_cueq_stale", True)
        return self

    def _select_kernels(self) -> None:
        """Make the network of ``kernels`` for the weights' device (see :data:`KERNELS`) and
        check it against the e3nn network."""
        choice = self._config["kernels"]
        device = next(self.model.parameters()).device
        if choice == "auto":
            use = _auto_uses_cuequivariance(device)
        else:
            use = choice == "cuequivariance"
        cueq = None
        if use:
            try:
                cueq = _to_cuequivariance(self.model, device)
                self._check_same_as(cueq, network=self.model)
            except ValueError as err:
                if choice != "auto":
                    raise
                warnings.warn(f"this MACE model runs on e3nn's kernels: {err}", stacklevel=2)
                cueq = None
        object.__setattr__(self, "_cueq", cueq)
        object.__setattr__(self, "_cueq_stale", False)

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        head: str | None = None,
        dtype: str | None = None,
        kernels: str = "auto",
    ) -> Mace:
        """Wrap a mace-torch model (its weights are copied; ``model`` is left as it is).

        The network is rebuilt from its hyperparameters and the copy checked against
        ``model`` on a small cluster of every element.

        A model built or converted with cuEquivariance (``cueq_config``) is converted back
        to e3nn's form by mace-torch's converter first; the rebuilt network is checked
        against the model as given.

        :param model: a ``mace.modules.MACE`` or ``ScaleShiftMACE`` (e3nn or cuEquivariance)
        :param head: head of a multi-head model (see the class)
        :param dtype: ``float64`` or ``float32``; default: the dtype of ``model``'s weights
        :param kernels: see the class
        :raises ValueError: the model cannot be rebuilt from plain data
        """
        if dtype is None:
            floating = [p.dtype for p in model.parameters() if p.is_floating_point()]
            source = floating[0] if floating else torch.float64
            dtype = {v: k for k, v in _DTYPES.items()}.get(source, "float64")
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {', '.join(KERNELS)}; got '{kernels}'")
        if kernels == "cuequivariance" and not _cueq_available():
            raise ImportError(f"kernels = cuequivariance needs {_CUEQ_INSTALL}")
        original = model
        _check_model_class(model)
        if _uses_openequivariance(model):
            raise ValueError(_OEQ_REFUSED)
        if _uses_cuequivariance(model):
            model = _to_e3nn(model)
        potential = cls(model_config(model), head=head, dtype=dtype, kernels="e3nn")
        state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        try:
            potential._load_weights(state)
        except RuntimeError as err:
            raise ValueError(f"the rebuilt MACE model does not take these weights: {err}") from None
        potential._check_same_as(original)
        potential._config["kernels"] = kernels
        object.__setattr__(potential, "_cueq_stale", True)
        return potential

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """As ``torch.nn.Module``'s, for the network's weights on either Clebsch-Gordan basis
        (see :meth:`_load_weights`)."""
        prefix = "model."
        if strict and all(k.startswith(prefix) for k in state_dict):
            return self._load_weights({k[len(prefix) :]: v for k, v in state_dict.items()})
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _load_weights(self, state: dict[str, torch.Tensor]) -> Any:
        """Load the network's weights; weights made for the other Clebsch-Gordan basis than
        the one built (a model exported with cuEquivariance installed, loaded without, or
        the other way round) rebuild the network on theirs, or, for the reduced basis
        without cuequivariance, raise ImportError naming the package."""
        object.__setattr__(self, "_cueq_stale", True)
        try:
            return self.model.load_state_dict(state)
        except RuntimeError as err:
            if not _basis_mismatch(err):
                raise
        config = self._config["model"]
        reduced = not (config["use_reduced_cg"] and _cueq_available())  # the other basis
        if reduced and not _cueq_available():
            raise ImportError(f"this MACE model cannot be built here: {_CUEQ_HINT}")
        config["use_reduced_cg"] = reduced
        self.model = _inference(build_model(config).to(self.spec.torch_dtype))
        return self.model.load_state_dict(state)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike,
        head: str | None = None,
        dtype: str = "float64",
        kernels: str = "auto",
    ) -> Mace:
        """Load a mace-torch model file (``torch.save`` of the model, e.g. ``*.model``).

        A mace-torch checkpoint is a pickle: loading it runs code from the file
        (``torch.load(weights_only=False)``). Only load files you trust. Export the result
        with :func:`~nvalchemi_lammps.save_model`: that file holds plain data, and loading it
        runs nothing from it.

        :param path: local path of the checkpoint
        :param head: head of a multi-head model (see the class)
        :param dtype: ``float64`` (default) or ``float32``
        :param kernels: see the class
        """
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"MACE checkpoint {path} not found")
        _mace()
        with _quiet_torchscript():
            model = torch.load(path, map_location="cpu", weights_only=False)
        if isinstance(model, dict) and "model" in model:  # a training checkpoint's wrapper
            model = model["model"]
        if not isinstance(model, torch.nn.Module):
            raise ValueError(  # noqa: TRY004 - a file of the wrong kind is a bad input value
                f"{path} holds a {type(model).__name__}, not a mace-torch model: weights "
                "alone (a training checkpoint) cannot be used; give the saved model "
                "(*.model) instead"
            )
        return cls.from_model(model, head=head, dtype=dtype, kernels=kernels)

    @classmethod
    def from_export_config(cls, config: dict[str, Any]) -> Mace:
        """What ``nvalchemi-lammps export`` builds from a TOML file with
        ``potential = "mace"``: ``checkpoint`` (path of a mace-torch model file, relative
        to the working directory; required), ``head``, ``dtype``, ``kernels``.

        The checkpoint is a pickle and is loaded as such (see :meth:`from_checkpoint`).
        """
        check_keys(config, "potential mace", ("checkpoint", "head", "dtype", "kernels"))
        if "checkpoint" not in config:
            raise ValueError('potential mace needs key checkpoint = "<mace-torch model file>"')
        try:
            return cls.from_checkpoint(
                config["checkpoint"],
                head=config.get("head"),
                dtype=config.get("dtype", "float64"),
                kernels=config.get("kernels", "auto"),
            )
        except ImportError as err:  # the CLI reports ValueErrors as one line
            raise ValueError(str(err)) from None

    def _check_same_as(
        self, model: torch.nn.Module, network: torch.nn.Module | None = None
    ) -> None:
        """The rebuilt network gives ``model``'s energies and pair forces on a small cluster
        of every element (the same code on the same weights: equal up to dtype rounding).

        :param network: the network to check (default: the rebuilt one, ``self.model``);
            with ``model`` its cuEquivariance conversion, which must agree with it
        """
        n = len(self.spec.elements)
        count = max(8, 2 * n)
        side = round(count ** (1 / 3) + 0.5)
        grid = torch.cartesian_prod(*[torch.arange(side, dtype=torch.float64)] * 3)[:count]
        generator = torch.Generator().manual_seed(0)
        noise = torch.rand(count, 3, generator=generator, dtype=torch.float64) - 0.5
        x = (grid + 0.2 * noise) * 0.45 * self.spec.cutoff
        species = torch.arange(count) % n
        i, j = torch.meshgrid(torch.arange(count), torch.arange(count), indexing="ij")
        i, j = i.reshape(-1), j.reshape(-1)
        rij = x[j] - x[i]
        keep = (i != j) & (torch.linalg.vector_norm(rij, dim=1) < self.spec.cutoff)
        i, j, rij = i[keep], j[keep], rij[keep]
        # the original in its own dtype and on its own device, left as it is
        weights = [p for p in model.parameters() if p.is_floating_point()]
        device = weights[0].device if weights else torch.device("cpu")
        their_dtype = weights[0].dtype if weights else torch.float64

        def run(network, dtype, device):
            leaf = rij.to(device).requires_grad_(True)
            graph = LocalGraph(count, species.to(device), i.to(device), j.to(device), leaf)
            energies = _node_energies(network, graph, self.head_index, dtype)
            (grad,) = torch.autograd.grad(energies.sum(), leaf)
            return energies.detach().double().cpu(), grad.double().cpu()

        mine = self.model if network is None else network
        mine = run(mine, self.spec.torch_dtype, next(mine.parameters()).device)
        theirs = run(model, their_dtype, device)
        tol = 1e-5 if torch.float32 in (self.spec.torch_dtype, their_dtype) else 1e-10
        for a, b in zip(mine, theirs):
            scale = float(b.abs().max())
            if not float((a - b).abs().max()) <= tol * (scale or 1.0):
                if network is not None:
                    raise ValueError(
                        "this MACE model converted to cuEquivariance by mace-torch gives other "
                        'energies or forces than on e3nn; use kernels = "e3nn"'
                    )
                raise ValueError(
                    "the MACE model rebuilt from its hyperparameters gives other energies or "
                    "forces than the original; this MACE variant is not supported"
                )

    def prepare_compile(self) -> Mace:
        """A copy whose network is rebuilt for ``torch.compile``: without e3nn's TorchScript
        code generation, which the compiler cannot trace, and with the blocks mace-torch
        marks for it simplified by ``torch.fx`` (``mace.tools.compile``), the same weights.
        Padding is inert: NULL atoms are masked and MACE's radial cutoff is zero beyond
        ``r_max``."""
        _mace()  # imported with its side effects undone
        from mace.tools.compile import disable_e3nn_codegen, simplify

        with disable_e3nn_codegen(), _quiet_torchscript(), _default_dtype(torch.float64):
            network = build_model(self._config["model"])
        network.load_state_dict(self.model.state_dict())
        compiled = copy.copy(self)
        compiled._modules = dict(self._modules)
        # the weights keep requiring gradients here: frozen, the compiled backward of a
        # 2-rank run lost a reverse exchange on one rank only, which then left the other
        # waiting in it (the ranks' collectives must match; tests/test_lammps_compile.py)
        compiled.model = simplify(network).to(next(self.model.parameters())).eval()
        for block in compiled.model.interactions:
            block.handle_lammps = types.MethodType(_handle_lammps_traced, block)
        # compiled code runs e3nn's kernels (cuEquivariance's are not traced here)
        object.__setattr__(compiled, "_cueq", None)
        object.__setattr__(compiled, "_cueq_stale", False)
        return compiled

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        return _node_energies(self.network, graph, self.head_index, self.spec.torch_dtype)


def _node_energies(
    model: torch.nn.Module, graph: LocalGraph, head: int, dtype: torch.dtype
) -> torch.Tensor:
    """MACE's ``node_energy`` of every row of ``graph`` (ghost rows: anything finite)."""
    mapped = graph.species >= 0
    num_elements = len(model.atomic_numbers)
    node_attrs = torch.nn.functional.one_hot(graph.species.clamp(min=0), num_elements)
    node_attrs = (node_attrs * mapped[:, None]).to(dtype)
    # MACE's edges run sender -> receiver, edge_index = [sender, receiver], and its edge
    # vector is x[receiver] - x[sender] (mace.modules.utils.get_edge_vectors_and_lengths);
    # here j sends to i and rij = x[j] - x[i].
    edge_index = torch.stack([graph.pair_j, graph.pair_i])
    vectors = -graph.rij.to(dtype)
    lengths = torch.linalg.vector_norm(vectors, dim=1, keepdim=True)

    # energies of the owned rows; ghost rows' are never read
    owned = energy_rows(graph)
    node_e0 = model.atomic_energies_fn(node_attrs[:owned])[:, head]
    node_feats = model.node_embedding(node_attrs)
    edge_attrs = model.spherical_harmonics(vectors)
    edge_feats, cutoff = model.radial_embedding(
        lengths, node_attrs, edge_index, model.atomic_numbers
    )
    if hasattr(model, "pair_repulsion"):
        pair_energy = model.pair_repulsion_fn(lengths, node_attrs, edge_index, model.atomic_numbers)
        pair_energy = pair_energy[:owned]
    else:
        pair_energy = torch.zeros_like(node_e0)

    edges = _Edges(edge_attrs, edge_feats, edge_index, cutoff)
    if _exchanges_in_blocks(graph, model):
        features = _owned_features(model, graph, node_attrs, node_feats, edges)
    else:
        features = _row_features(model, graph, node_attrs, node_feats, edges)

    node_heads = graph.species.new_full((owned,), head)
    last_only = len(model.readouts) == 1
    readout_energies = [
        readout(_leading_rows(features[-1 if last_only else k], owned), node_heads)[:, head]
        for k, readout in enumerate(model.readouts)
    ]
    if hasattr(model, "scale_shift"):
        # ScaleShiftMACE scales the pair repulsion with the readouts, not the E0s
        interaction_energy = torch.stack([pair_energy, *readout_energies]).sum(dim=0)
        energies = node_e0 + model.scale_shift(interaction_energy, node_heads)
    else:
        energies = torch.stack([node_e0, pair_energy, *readout_energies]).sum(dim=0)
    return with_ghost_rows(torch.where(mapped[:owned], energies, 0.0), graph.ntotal)


def _leading_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x[:rows]``, or ``x`` itself when it has just those rows (the exchange strategy's
    owned features): a slice of every row would still cost a zero-fill and a copy in the
    backward pass."""
    return x if x.shape[0] == rows else x[:rows]


class _Edges(NamedTuple):
    """The interaction blocks' edge arguments, by their names there."""

    edge_attrs: torch.Tensor
    edge_feats: torch.Tensor
    edge_index: torch.Tensor
    cutoff: torch.Tensor | None


def _row_features(
    model: torch.nn.Module,
    graph: LocalGraph,
    node_attrs: torch.Tensor,
    node_feats: torch.Tensor,
    edges: _Edges,
) -> list[torch.Tensor]:
    """Every layer's features, rows of the whole graph (``updated_rows`` decides which are
    computed), ghost rows exchanged between layers by ``graph.comm``."""
    features = []
    plan = updated_rows(graph, len(model.interactions))
    for layer, (interaction, product, rows) in enumerate(
        zip(model.interactions, model.products, plan)
    ):
        if layer > 0:
            # ghosts take their owners' features (the identity under the widened shell)
            node_feats = graph.comm.forward_exchange(node_feats)
        node_feats, sc = interaction(
            node_attrs=node_attrs,
            node_feats=node_feats,
            first_layer=layer == 0,
            **_receiving_edges(graph, rows, edges)._asdict(),
        )
        # the product basis, mace's costliest block per atom, on the rows whose update is used
        attrs = node_attrs
        if rows is not None:
            node_feats, attrs = node_feats[rows], node_attrs[rows]
            sc = None if sc is None else sc[rows]
        node_feats = scattered(rows, _product(product, node_feats, sc, attrs), graph.ntotal)
        features.append(node_feats)
    return features


def _owned_features(
    model: torch.nn.Module,
    graph: LocalGraph,
    node_attrs: torch.Tensor,
    node_feats: torch.Tensor,
    edges: _Edges,
) -> list[torch.Tensor]:
    """Every layer's features of the owned rows, for the exchange strategy, as mace-torch's
    ML-IAP path runs the blocks: past the first layer an interaction takes the owned rows,
    exchanges the ghosts' after its ``linear_up`` (``InteractionBlock.handle_lammps``, here
    through ``graph.comm``) and keeps the owned rows' messages, so no per-atom work is done
    on ghost rows but the first layer's embedding."""
    nlocal = graph.nlocal
    hook = _ExchangeHook(graph.comm)
    natoms = (nlocal, graph.ntotal - nlocal)
    owned_attrs = node_attrs[:nlocal]
    features = []
    for layer, (interaction, product) in enumerate(zip(model.interactions, model.products)):
        node_feats, sc = interaction(
            node_attrs=owned_attrs if layer else node_attrs,
            node_feats=node_feats,
            first_layer=layer == 0,
            lammps_class=hook,
            lammps_natoms=natoms,
            **edges._asdict(),
        )
        node_feats = _product(product, node_feats, sc, owned_attrs)
        features.append(node_feats)
    return features


def _product(
    product: torch.nn.Module, node_feats: torch.Tensor, sc: torch.Tensor | None, attrs: torch.Tensor
) -> torch.Tensor:
    """The product basis block on ``node_feats``' rows, also on none."""
    if len(node_feats):
        return product(node_feats=node_feats, sc=sc, node_attrs=attrs)
    # mace's symmetric contraction cannot reshape zero rows; a rank without atoms still
    # exchanges (and reverse-exchanges in backward) like every other rank, so its empty
    # features stay connected to the pair vectors
    width = product.linear.irreps_out.dim
    return node_feats.sum() * node_feats.new_zeros(0, width)


class _ExchangeHook:
    """mace-torch's ghost exchange (``lammps_class`` of its interaction blocks, called by
    ``mace.tools.utils.LAMMPS_MP``: forward after ``linear_up``, reverse in the backward)
    over the contract's collectives."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def forward_exchange(self, src: torch.Tensor, dst: torch.Tensor, width: int) -> None:
        self.comm.exchange_into(src, dst, forward=True)

    def reverse_exchange(self, src: torch.Tensor, dst: torch.Tensor, width: int) -> None:
        self.comm.exchange_into(src, dst, forward=False)


def _handle_lammps_traced(
    block: torch.nn.Module,
    node_feats: torch.Tensor,
    lammps_class: _ExchangeHook | None,
    lammps_natoms: tuple[int, int],
    first_layer: bool,
) -> torch.Tensor:
    """An interaction block's ``handle_lammps`` in the compiled copy: the owned rows, zero
    ghost rows, through the contract's ``forward_exchange`` (a custom operator with its
    derivative, engine/_compiled.py) rather than mace-torch's ``LAMMPS_MP``. That autograd
    function returns a new tensor written in place by the exchange, and torch 2.11's
    compiler differentiates such an output wrongly: the gradients into the exchange come
    out zero, and with them every force through the ghosts' features (torch 2.13 is right;
    ``tests/test_compiled.py::test_exchange_strategy_on_owned_rows`` under torch 2.11)."""
    if lammps_class is None or first_layer:
        return node_feats
    n_real, n_ghost = lammps_natoms
    if node_feats.shape[0] != n_real + n_ghost:
        node_feats = torch.cat((node_feats, node_feats.new_zeros(n_ghost, node_feats.shape[1])))
    return lammps_class.comm.forward_exchange(node_feats)


def _exchanges_in_blocks(graph: LocalGraph, model: torch.nn.Module) -> bool:
    """Run the blocks as mace-torch's ML-IAP path does (:func:`_owned_features`): with the
    exchange strategy, or one interaction under any strategy (nothing is exchanged, and no
    ghost row's update is used: the block's message ``linear`` and what follows take the
    owned rows only), where every interaction block takes the exchange hook (mace-torch's
    ``lammps_natoms``). Compiled too, the blocks' exchange being the compiled graph's
    custom operator (:func:`_handle_lammps_traced`)."""
    one_layer = len(model.interactions) == 1
    if not (graph.comm.exchange or one_layer):
        return False
    return all(_takes_exchange_hook(type(block)) for block in model.interactions)


def _takes_exchange_hook(block: type) -> bool:
    # and exchanges in handle_lammps, which the compiled copy replaces (prepare_compile)
    code = block.forward.__code__  # its arguments' names (read by torch.compile too)
    arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return "lammps_natoms" in arguments and hasattr(block, "handle_lammps")


def _receiving_edges(graph: LocalGraph, rows: Rows, edges: _Edges) -> _Edges:
    """The edges into ``rows`` (``None``: all)."""
    pairs = receiving_pairs(graph, rows)
    if pairs is None:
        return edges
    edge_attrs, edge_feats, edge_index, cutoff = edges
    return _Edges(
        edge_attrs[pairs],
        edge_feats[pairs],
        edge_index[:, pairs],
        None if cutoff is None else cutoff[pairs],
    )
