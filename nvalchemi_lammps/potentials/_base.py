from __future__ import annotations

from importlib import import_module, metadata
from typing import Any

import torch

from ..contract import LocalGraph, ModelSpec

_REGISTRY: dict[str, type[Potential]] = {}

#: Entry-point group through which other packages provide potentials: ``name = "pkg.mod:Cls"``
#: makes model files of potential ``name`` loadable wherever that package is installed.
ENTRY_POINT_GROUP = "nvalchemi_lammps.potentials"

#: Potentials of this package by model-file name -> module under ``potentials``, imported
#: on first use so that a model file needs only its own potential's dependencies.
BUILTIN_MODULES = {
    "lennard_jones": "lennard_jones",
    "message_passing": "message_passing",
    "mace": "mace",
    "ewald": "ewald",
    "pme": "pme",
    "dftd3": "dftd3",
    "aimnet2": "aimnet2",
    "uma": "uma",
    "toolkit_lennard_jones": "toolkit_lennard_jones",
    "pipeline": "pipeline",
}


class Potential(torch.nn.Module):
    """Base class of every potential.

    A subclass sets ``name`` (the key written to model files), keeps a :class:`ModelSpec`
    in ``self.spec``, and implements:

    - ``forward(graph) -> energies``: ``(ntotal,)`` per-atom energies in ``spec.dtype``; the
      engine sums rows ``[0, nlocal)`` only, so ghost rows may hold anything finite;
    - ``config() -> dict``: JSON-serialisable constructor arguments, so that
      ``type(p).from_config(p.config())`` rebuilds the same potential (weights come back
      through ``state_dict``).
    """

    name: str = ""
    spec: ModelSpec

    def forward(self, graph: LocalGraph) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def config(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Potential:
        return cls(**config)

    def pair_terms(self, graph: LocalGraph) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A pair potential's energy and derivative in closed form, which the engine then
        uses instead of differentiating :meth:`forward` (the same energies): each pair's
        share of its receiver's energy and ``(1/r) d(share)/dr``, so that the pair force is
        ``fij = (1/r) d(share)/dr * rij``; both ``(npairs,)`` in ``spec.dtype``. ``None``
        (the default): no closed form."""
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


def register_potential(cls: type[Potential]) -> type[Potential]:
    """Class decorator: make ``cls`` loadable from model files under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def potential_class(name: str) -> type[Potential]:
    """The potential class called ``name``: registered here, or provided by an installed
    package through the ``nvalchemi_lammps.potentials`` entry-point group."""
    if name not in _REGISTRY and name in BUILTIN_MODULES:
        import_module(f"{__package__}.{BUILTIN_MODULES[name]}")
    if name not in _REGISTRY:
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
            _REGISTRY.setdefault(name, entry.load())
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ValueError(f"unknown potential '{name}' (known: {known})") from None
