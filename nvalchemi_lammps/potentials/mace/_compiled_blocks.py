"""MACE's network with its blocks under ``torch.compile``, for the captured step.

Captured as CUDA graphs, mace-torch's network on cuEquivariance's kernels still runs a few
hundred element-wise kernels per step around them (the radial basis and its MLP, the
spherical harmonics, the blocks' reshapes, sums and gates, and their backward). Compiled,
inductor fuses them; the captured step then replays the fused kernels and cuEquivariance's
(traced as the custom operators they are). The readouts stay eager: dynamo's guards call
``len()`` of e3nn's ``Irrep``, which raises.

Each compiled function compiles for the shapes it first sees, and once more, for any
shape, when they change (torch's automatic dynamic shapes): a captured step's shapes are its
capacities, which change only when they grow.
"""

from __future__ import annotations

import copy
import functools
import types
from typing import Any

import torch

from ..._quiet import without_compiler_warnings
from ._forward import _handle_lammps_traced

#: what is compiled: modules of the network, and the blocks of its ModuleLists (each keeps
#: its class: the forward reads the interaction blocks' arguments from it)
_MODULES = ("radial_embedding", "spherical_harmonics")
_BLOCKS = ("interactions", "products")


def _compiled_blocks(network: torch.nn.Module) -> torch.nn.Module:
    """A shallow copy of ``network`` (the same weights) whose blocks run compiled."""
    # compiled functions are cached per code object, for every block and shape so far;
    # past the limit (8 by default) torch would run the rest uncompiled
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 64)
    compiled = copy.copy(network)
    compiled._modules = dict(network._modules)
    for name in _MODULES:
        setattr(compiled, name, _compiled(getattr(network, name)))
    for name in _BLOCKS:
        setattr(compiled, name, torch.nn.ModuleList(_compiled(b) for b in getattr(network, name)))
    return compiled


def _compiled(module: torch.nn.Module) -> torch.nn.Module:
    """A shallow copy of ``module`` (its class, its weights) whose forward is compiled."""
    compiled = copy.copy(module)
    if hasattr(module, "handle_lammps"):  # an interaction block's ghost exchange, traced
        # through the contract's exchange, as in the compiled potential (_forward.py)
        compiled.handle_lammps = types.MethodType(_handle_lammps_traced, compiled)
    forward = _compiled_forward(type(module).forward)

    def quietly(*args: Any, **kwargs: Any) -> Any:
        with without_compiler_warnings():  # where it compiles: at the first calls
            return forward(compiled, *args, **kwargs)

    compiled.forward = quietly
    return compiled


@functools.cache
def _compiled_forward(forward: Any) -> Any:
    """``forward``, a module class's, compiled once for every module of the class (torch
    compiles it again only for what its guards tell apart)."""
    with without_compiler_warnings():
        return torch.compile(forward)
