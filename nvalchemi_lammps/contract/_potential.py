"""The interface every potential implements, with every hook a front door, the engine or a
pipeline may call declared here with its default: nothing outside ``contract`` asks a
potential whether it has a method."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._graph import LocalGraph
from ._spec import ModelSpec


def check_keys(
    config: dict[str, Any], what: str, allowed: Sequence[str], required: Sequence[str] = ()
) -> None:
    """Refuse an export configuration (a TOML table less its ``potential`` key) with a key
    not in ``allowed``, or without one of ``required``.

    :param what: the configuration in messages, e.g. ``potential mace``
    :raises ValueError: naming the unknown keys and the allowed ones, or the missing ones
    """
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(unknown)} for {what} "
            f"(allowed: potential, {', '.join(allowed)})"
        )
    missing = [k for k in required if k not in config]
    if missing:
        raise ValueError(f"{what} needs key(s) {', '.join(missing)}")


class Potential(torch.nn.Module):
    """Base class of every potential.

    A subclass sets ``name`` (the key written to model files), keeps a :class:`ModelSpec`
    in ``self.spec``, and implements:

    - ``forward(graph) -> energies``: ``(ntotal,)`` per-atom energies in ``spec.dtype``; the
      engine sums rows ``[0, nlocal)`` only, so ghost rows may hold anything finite;
    - ``config() -> dict``: JSON-serialisable constructor arguments, so that
      ``type(p).from_config(p.config())`` rebuilds the same potential (weights come back
      through ``state_dict``).

    Everything else below has a default that fits a plain potential.
    """

    name: str = ""
    spec: ModelSpec
    #: What :meth:`outputs` returns: ``energies``, and ``charges`` for a potential that
    #: predicts them (a pipeline term may read another's predicted charges).
    predicts: tuple[str, ...] = ("energies",)
    #: Which of the whole system's ``spin`` and ``task`` (``pair_style nvalchemi ... spin S
    #: task NAME``) the potential takes; :meth:`check_system_state` refuses the others.
    system_state: tuple[str, ...] = ()
    #: The box the potential runs in: periodic along each lattice direction, or not (a
    #: slab). Only a potential whose spec ``needs_positions`` reads the cell.
    periodicity: tuple[bool, bool, bool] = (True, True, True)
    #: :meth:`pair_terms` is symmetric and always given: a pair's share and derivative are
    #: the same seen from either atom (parameters of the unordered pair of elements, a
    #: function of ``|rij|`` only). A front door may then hand each pair once (a half
    #: neighbor list) and the engine counts it for both atoms (``evaluate(...,
    #: half_pairs=True)``): half the pairs to compute.
    symmetric_pair_terms: bool = False
    #: The potential lays each row's received pairs side by side (a neighbor matrix, as
    #: aimnet's modules take them), whose width is a shape: on padded graphs the engine
    #: fixes it, a capacity at least the most pairs any row receives
    #: (``LocalGraph.row_pairs``), grown as the other capacities are.
    pairs_by_row: bool = False
    #: What of the potential's captured step runs under ``torch.compile`` ("" for nothing):
    #: set on the copy :meth:`prepare_capture` makes, for LAMMPS's log.
    compiled_in_capture: str = ""

    def forward(self, graph: LocalGraph) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def config(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Potential:
        return cls(**config)

    @classmethod
    def from_export_config(cls, config: dict[str, Any]) -> Potential:
        """The potential that ``nvalchemi-lammps export`` builds from a TOML table (without
        its ``potential`` key). The default takes the constructor's arguments by name; a
        potential made from something else (a checkpoint, a seed) overrides this.

        :raises ValueError: unknown or missing keys, or values the potential rejects
        """
        parameters = inspect.signature(cls.__init__).parameters
        allowed = [p for p in parameters if p != "self"]
        required = [p for p in allowed if parameters[p].default is inspect.Parameter.empty]
        check_keys(config, f"potential {cls.name}", allowed, required)
        return cls.from_config(config)

    def outputs(self, graph: LocalGraph) -> dict[str, torch.Tensor]:
        """Every per-atom quantity of :attr:`predicts`, ``(ntotal,)`` each, by name."""
        return {"energies": self(graph)}

    def check_system_state(self, spin: int | None, task: str | None) -> None:
        """Refuse a spin or task (``None``: not given) the potential cannot take, before
        the run. The default refuses any keyword not in :attr:`system_state`.

        :raises ValueError: with what is wrong
        """
        for keyword, value in (("spin", spin), ("task", task)):
            if value is not None and keyword not in self.system_state:
                raise ValueError(f"the {self.name} model takes no {keyword}")

    def check_box(self, pbc: tuple[bool, bool, bool]) -> None:
        """Refuse, before the run, a box whose periodicity along x, y and z the potential
        cannot run in (the front door asks at setup, on every rank). The default takes any
        box.

        :raises ValueError: with what is wrong
        """

    def check_graph(self, graph: LocalGraph) -> None:
        """Refuse a step's graph the potential cannot evaluate, by a check that reads values
        back from the device (a count of neighbors, say). A captured step replays graphs
        without running the forward: the engine calls this on each step's graph before the
        replay, outside the graphs; the potential's forward calls it where no capture is
        under way. The default refuses nothing.

        :raises ValueError: with what is wrong
        """

    def pair_terms(self, graph: LocalGraph) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A pair potential's energy and derivative in closed form, which the engine then
        uses instead of differentiating :meth:`forward` (the same energies): each pair's
        share of its receiver's energy and ``(1/r) d(share)/dr``, so that the pair force is
        ``fij = (1/r) d(share)/dr * rij``; both ``(npairs,)`` in ``spec.dtype``. ``None``
        (the default): no closed form. Never ``None`` when :attr:`symmetric_pair_terms`."""
        return None

    def prepare_compile(self) -> Potential:
        """This potential (or an equal one) ready for ``torch.compile`` on padded graphs
        (:class:`~nvalchemi_lammps.engine.CompiledPotential`).

        A subclass that overrides this promises: atoms of species -1 and pairs longer than
        the cutoff get zero energy and zero gradient (they pad graphs to fixed shapes); the
        forward has no Python branch on tensor values and reads ``graph.nlocal`` only where
        a change of it may recompile.

        :raises ValueError: the potential cannot be compiled (the default)
        """
        raise ValueError(f"the {self.name} model cannot be compiled (no compile support)")

    def prepare_capture(self) -> Potential:
        """This potential (or an equal one) ready to be captured as CUDA graphs on padded
        graphs (:class:`~nvalchemi_lammps.engine.CapturedPotential`): padding inert as
        :meth:`prepare_compile` promises, and no host synchronization in the forward or
        the backward (no ``.item()``, no shape that depends on values). The default is
        :meth:`prepare_compile`'s potential; a potential whose own forward keeps those
        promises returns itself and is captured with its own kernels.

        :raises ValueError: the potential cannot run on padded graphs
        """
        try:
            return self.prepare_compile()
        except ValueError as cannot:
            raise ValueError(
                f"the {self.name} model cannot be captured (it does not run on padded graphs: "
                "no compile or capture support)"
            ) from cannot

    def parts(self) -> list[Potential]:
        """The potentials evaluated one by one inside this one (a pipeline's terms); the
        potential itself by default."""
        return [self]

    def compiled(self, wrap: Callable[[Potential], Potential]) -> Potential:
        """This potential with what can be compiled wrapped by ``wrap`` (the engine's
        compiler), a drop-in for it. The default wraps the whole potential; a potential
        made of parts (a pipeline) wraps those it can.

        :raises ValueError: nothing in this potential can be compiled
        """
        return wrap(self)
