"""The potential: :class:`Mace` holds a mace-torch network rebuilt from plain data, picks
its kernels for the device its weights are on, and runs :mod:`._forward` on a LocalGraph.
"""

from __future__ import annotations

import copy
import os
import threading
import types
import warnings
from pathlib import Path
from typing import Any

import torch

from ..._quiet import without_torchscript_warnings as _quiet_torchscript
from ...contract import LocalGraph, ModelSpec, check_keys
from .._base import Potential, register_potential
from ._chunked import check_chunkable
from ._compiled_blocks import _compiled_blocks
from ._config import (
    _check_keys,
    _check_model_class,
    _element_symbols,
    _head_index,
    build_model,
    model_config,
)
from ._forward import _handle_lammps_traced, _node_energies
from ._kernels import (
    _CUEQ_HINT,
    _CUEQ_INSTALL,
    _OEQ_REFUSED,
    KERNELS,
    _auto_uses_cuequivariance,
    _basis_mismatch,
    _cueq_available,
    _to_cuequivariance,
    _to_e3nn,
    _uses_cuequivariance,
    _uses_openequivariance,
)
from ._mace_torch import _default_dtype, _inference, _mace

_DTYPES = {"float32": torch.float32, "float64": torch.float64}

#: held while a network is made on first use: mace-torch builds under torch's default dtype,
#: which is the process's, and ranks of one process (threads) share a potential
_BUILDING = threading.Lock()


def _check_pair_chunk(pair_chunk: Any, model: dict[str, Any]) -> None:
    """``pair_chunk`` a count of pairs (0: off), for interaction blocks that run chunked."""
    if isinstance(pair_chunk, bool) or not isinstance(pair_chunk, int) or pair_chunk < 0:
        raise ValueError(f"pair_chunk must be an integer >= 0 (0: off); got {pair_chunk!r}")
    if pair_chunk:
        check_chunkable([model["interaction_cls_first"], model["interaction_cls"]])


def _check_compile_blocks(compile_blocks: Any) -> None:
    if not isinstance(compile_blocks, bool):
        raise ValueError(  # noqa: TRY004 - a bad value in a model file or its TOML
            f"compile_blocks must be true or false; got {compile_blocks!r}"
        )


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
    :param pair_chunk: run the interaction blocks' per-pair work in chunks of this many
        pairs, each made again in the backward pass (:mod:`._chunked`): peak memory of one
        chunk's pair work instead of every pair's, for about one more forward of the pair
        work; 0 (default): all pairs at once. For systems whose pairs do not fit in GPU
        memory otherwise (MACE-MP-0 medium's shape: ~17 kB per pair in float32)
    :param compile_blocks: where the model is captured (CUDA graphs, ``pair_style ...
        capture``), run its interaction and product blocks, radial embedding and spherical
        harmonics under ``torch.compile`` inside the captured step (:func:`._compiled_blocks`):
        their element-wise work fused around cuEquivariance's kernels, for a compilation at
        the first step and once more when the capacities first grow. Runs that are not
        captured are not compiled.
    """

    name = "mace"

    def __init__(
        self,
        model: dict[str, Any],
        head: str | None = None,
        dtype: str = "float64",
        kernels: str = "auto",
        pair_chunk: int = 0,
        compile_blocks: bool = False,
    ) -> None:
        super().__init__()
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}; got '{dtype}'")
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {', '.join(KERNELS)}; got '{kernels}'")
        _check_keys(model)
        _check_pair_chunk(pair_chunk, model)
        _check_compile_blocks(compile_blocks)
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
            "pair_chunk": int(pair_chunk),
            "compile_blocks": compile_blocks,
        }
        if kernels == "cuequivariance" and not _cueq_available():
            raise ImportError(f"kernels = cuequivariance needs {_CUEQ_INSTALL}")
        # the network that runs: self.model, or its cuEquivariance conversion for the device,
        # made when first needed after the weights changed device or values (see
        # _select_kernels); not a submodule, so that weights and model files keep e3nn's form
        object.__setattr__(self, "_cueq", None)
        object.__setattr__(self, "_cueq_stale", True)
        # in the copy that is captured (prepare_capture): the kernels' network, compiled
        object.__setattr__(self, "_compiles_blocks", False)
        object.__setattr__(self, "_network", None)

    def config(self) -> dict[str, Any]:
        return copy.deepcopy(self._config)

    @property
    def kernels(self) -> str:
        """The kernels the network runs on where its weights are now: ``e3nn`` or
        ``cuequivariance``."""
        self.network  # noqa: B018  (chosen when first needed)
        return "e3nn" if self._cueq is None else "cuequivariance"

    @property
    def network(self) -> torch.nn.Module:
        """The mace-torch network that :meth:`forward` runs."""
        if self._cueq_stale:
            with _BUILDING:
                if self._cueq_stale:
                    self._select_kernels()
        if self._compiles_blocks:
            return self._network
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
        if self._compiles_blocks:
            network = _compiled_blocks(self.model if cueq is None else cueq)
            object.__setattr__(self, "_network", network)
        object.__setattr__(self, "_cueq", cueq)
        object.__setattr__(self, "_cueq_stale", False)

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        head: str | None = None,
        dtype: str | None = None,
        kernels: str = "auto",
        pair_chunk: int = 0,
        compile_blocks: bool = False,
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
        :param pair_chunk: see the class
        :param compile_blocks: see the class
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
        potential = cls(
            model_config(model),
            head=head,
            dtype=dtype,
            kernels="e3nn",
            pair_chunk=pair_chunk,
            compile_blocks=compile_blocks,
        )
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
        pair_chunk: int = 0,
        compile_blocks: bool = False,
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
        :param pair_chunk: see the class
        :param compile_blocks: see the class
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
        return cls.from_model(
            model,
            head=head,
            dtype=dtype,
            kernels=kernels,
            pair_chunk=pair_chunk,
            compile_blocks=compile_blocks,
        )

    @classmethod
    def from_export_config(cls, config: dict[str, Any]) -> Mace:
        """What ``nvalchemi-lammps export`` builds from a TOML file with
        ``potential = "mace"``: ``checkpoint`` (path of a mace-torch model file, relative
        to the working directory; required), ``head``, ``dtype``, ``kernels``, ``pair_chunk``,
        ``compile_blocks``.

        The checkpoint is a pickle and is loaded as such (see :meth:`from_checkpoint`).
        """
        check_keys(
            config,
            "potential mace",
            ("checkpoint", "head", "dtype", "kernels", "pair_chunk", "compile_blocks"),
        )
        if "checkpoint" not in config:
            raise ValueError('potential mace needs key checkpoint = "<mace-torch model file>"')
        try:
            return cls.from_checkpoint(
                config["checkpoint"],
                head=config.get("head"),
                dtype=config.get("dtype", "float64"),
                kernels=config.get("kernels", "auto"),
                pair_chunk=config.get("pair_chunk", 0),
                compile_blocks=config.get("compile_blocks", False),
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
        object.__setattr__(compiled, "_compiles_blocks", False)
        object.__setattr__(compiled, "_cueq_stale", False)
        return compiled

    def prepare_capture(self) -> Mace:
        """Itself, or with ``compile_blocks`` a copy on the same weights whose blocks run
        compiled (:func:`._compiled_blocks`): its forward masks NULL atoms, MACE's radial
        cutoff is zero beyond ``r_max``, and neither e3nn's generated code nor
        cuEquivariance's kernels synchronize with the host, so a capture keeps them."""
        if not self._config["compile_blocks"]:
            return self
        captured = copy.copy(self)
        captured._modules = dict(self._modules)  # the same weights
        # the same kernels' network (made again, compiled, after a change of device)
        object.__setattr__(captured, "_network", _compiled_blocks(self.network))
        object.__setattr__(captured, "_compiles_blocks", True)
        captured.compiled_in_capture = "its blocks"
        return captured

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        return _node_energies(
            self.network,
            graph,
            self.head_index,
            self.spec.torch_dtype,
            self._config["pair_chunk"],
        )
