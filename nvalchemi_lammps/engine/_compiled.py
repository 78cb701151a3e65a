"""A potential under ``torch.compile`` on graphs padded to fixed shapes (:mod:`._padding`).

A compiled graph is specialized to its input shapes: padded to capacities, the shapes stay
the same from step to step and the potential compiles once. When a graph outgrows a
capacity, the capacity grows by the headroom and the potential compiles again;
:attr:`CompiledPotential.compilations` counts every graph compiled.

Collectives stay outside the compiled code: inside it, ``graph.comm`` is a stand-in whose
exchanges and all-reduces are custom operators (opaque to the compiler, with each other as
derivatives), which call the step's real communication on the unpadded rows. The compiler
keeps every one of them, also one whose result a rank's graph does not read: every rank
calls the same collectives.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.node import has_side_effect

from .._quiet import without_compiler_warnings
from ..contract import Comm, LocalGraph, Potential
from ._padding import Capacities, PaddedGraph, PaddedPotential

#: ``torch.compile`` modes a pair style may ask for (``pair_style nvalchemi ... compile M``)
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class _Active:
    """The communication of the step being computed and where its rows are in the padded
    graph (owned rows, the owned capacity at which the ghosts start, ghost rows), read by
    the operators below during the forward and the backward that follows it."""

    comm: Comm | None = None
    nlocal = 0
    owned = 0
    nghost = 0


def _on_rows(operation: Any, src: torch.Tensor) -> torch.Tensor:
    # the real rows in LAMMPS's order through the operation; padding rows are their own
    # owners: they pass through unchanged
    nlocal, owned, end = _Active.nlocal, _Active.owned, _Active.owned + _Active.nghost
    rows = operation(torch.cat((src[:nlocal], src[owned:end])))
    return torch.cat((rows[:nlocal], src[nlocal:owned], rows[nlocal:], src[end:]))


# Never captured into a CUDA graph (modes with CUDA graphs): a replay would skip the Python
# that sends rows between ranks and would reuse the exchange plan of the capture. The tag
# exists from torch 2.9; without it those modes are refused (CompiledPotential).
_CUDAGRAPH_UNSAFE = hasattr(torch.Tag, "cudagraph_unsafe")
_OPTIONS: dict[str, Any] = {"mutates_args": ()}
if _CUDAGRAPH_UNSAFE:
    _OPTIONS["tags"] = (torch.Tag.cudagraph_unsafe,)


@torch.library.custom_op("nvalchemi_lammps::forward_exchange", **_OPTIONS)
def _forward_exchange(src: torch.Tensor) -> torch.Tensor:
    return _on_rows(_Active.comm.forward_exchange, src)


@torch.library.custom_op("nvalchemi_lammps::reverse_exchange", **_OPTIONS)
def _reverse_exchange(src: torch.Tensor) -> torch.Tensor:
    return _on_rows(_Active.comm.reverse_exchange, src)


@torch.library.custom_op("nvalchemi_lammps::allreduce", **_OPTIONS)
def _allreduce(x: torch.Tensor) -> torch.Tensor:
    return _Active.comm.allreduce(x).clone()


for _op in (_forward_exchange, _reverse_exchange, _allreduce):
    _op.register_fake(lambda src: torch.empty_like(src))
    # every rank calls every collective, also one whose result its graph does not read:
    # the compiler's dead code elimination would leave the other ranks waiting for it
    # (honored by torch 2.13's inductor; the padding pair in forward() covers older ones)
    has_side_effect(_op._opoverload)
_forward_exchange.register_autograd(lambda ctx, grad: _reverse_exchange(grad))
_reverse_exchange.register_autograd(lambda ctx, grad: _forward_exchange(grad))
_allreduce.register_autograd(lambda ctx, grad: _allreduce(grad))


class _TracedComm(Comm):
    """``graph.comm`` inside compiled code: the collectives as custom operators."""

    def forward_exchange(self, src: torch.Tensor) -> torch.Tensor:
        return _forward_exchange(src)

    def reverse_exchange(self, src: torch.Tensor) -> torch.Tensor:
        return _reverse_exchange(src)

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        return _allreduce(x)


def _options(mode: str) -> dict[str, Any]:
    """Inductor's settings for a ``torch.compile`` mode."""
    from torch._inductor import list_mode_options

    return list_mode_options(mode)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"compile mode must be one of {', '.join(MODES)}; got '{mode}'")
    if _options(mode).get("triton.cudagraphs") and not _CUDAGRAPH_UNSAFE:
        raise ValueError(
            f"compile mode {mode} (CUDA graphs) needs torch >= 2.9 to keep the ghost "
            f"exchanges out of the graphs; this is torch {torch.__version__}"
        )


class CompiledPotential(PaddedPotential):
    """``potential`` compiled once for padded graphs; a drop-in for it in :func:`evaluate`.

    :param potential: a potential whose :meth:`~Potential.prepare_compile` succeeds
    :param mode: a ``torch.compile`` mode (:data:`MODES`)
    :param headroom: capacities are the first graph's sizes times ``1 + headroom``, and grow
        the same way when a graph outgrows them
    """

    def __init__(self, potential: Potential, mode: str = "default", headroom: float = 0.2):
        _check_mode(mode)
        super().__init__(potential.prepare_compile(), potential, Capacities(float(headroom)))
        self.mode = mode
        #: graphs compiled so far (forward graphs; each brings its backward)
        self.compilations = 0
        self._comm = _TracedComm()
        # compiled graphs are cached per function, for every instance and every capacity
        # so far; past the limit (8 by default) torch would stop compiling
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, 64)
        self._compiled = torch.compile(
            self._energies, backend=self._backend, dynamic=False, fullgraph=True
        )

    def _backend(self, graph_module: torch.fx.GraphModule, inputs: list) -> Any:
        # inductor, as torch.compile(mode=...) would call it, counted
        from torch._inductor.compile_fx import compile_fx

        compiled = compile_fx(graph_module, inputs, config_patches=_options(self.mode))
        # counted once it succeeds: with a cold inductor cache, torch may abandon a first
        # attempt (an exception that restarts the trace) and compile the frame again
        self.compilations += 1
        return compiled

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        self.capacities.fit(graph)
        self._comm.exchange = graph.comm.exchange  # the potential's plan of rows reads it
        nlocal, nghost, owned = graph.nlocal, graph.ntotal - graph.nlocal, self.capacities.owned
        _Active.comm, _Active.nlocal, _Active.owned, _Active.nghost = (
            graph.comm,
            nlocal,
            owned,
            nghost,
        )
        with without_compiler_warnings():
            # new buffers every step, differentiable: the compiled code's backward holds
            # the padded graph it saw, and differentiates into the step's own graph
            padded = PaddedGraph(self.capacities, self.spec.cutoff, graph)
            padded.load(graph)
            padded.load_values(*padded.values(graph))
            # the compiled code guards only on what the potential reads of the graph
            energies = self._compiled(padded.graph(self._comm))
        return padded.unpadded(energies)

    def _energies(self, graph: LocalGraph) -> torch.Tensor:
        return self.inner(graph)


def compile_potential(
    potential: Potential, mode: str = "default", headroom: float = 0.2
) -> Potential:
    """``potential`` under ``torch.compile`` on padded graphs, a drop-in for it: wrapped in
    a :class:`CompiledPotential`, or, for a potential made of parts (a pipeline), the parts
    that can be (:meth:`Potential.compiled <nvalchemi_lammps.contract.Potential.compiled>`).

    :raises ValueError: an unknown mode, or nothing in ``potential`` can be compiled
    """
    _check_mode(mode)
    return potential.compiled(lambda part: CompiledPotential(part, mode, headroom))
