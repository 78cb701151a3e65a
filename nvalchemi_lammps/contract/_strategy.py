"""The one rule for how a potential reaches past one cutoff on a decomposed system.

``pair_style nvalchemi ... strategy exchange|shell|auto`` asks; :func:`resolve_strategy`
decides, once, in the plugin's Python session. The pair style (C++) reads the decision back,
and the plugin reports it (:data:`REPORT_ENV`); ``nvalchemi-lammps validate`` calls the same
function to know what to expect, and reads the report to see what ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ._spec import ModelSpec

#: What a run may ask for: a strategy of the spec's, or ``auto`` (the spec's first).
ASKABLE = ("exchange", "shell", "auto")
#: Environment variable naming a folder where each plugin session writes its decision as
#: ``strategy-<pid>.json`` (:meth:`Strategy.to_dict`), for tools that run LAMMPS.
REPORT_ENV = "NVALCHEMI_LAMMPS_REPORT_DIR"


@dataclass(frozen=True)
class Strategy:
    """What runs: ``local`` (one layer: neither exchange nor shell), ``exchange`` or
    ``shell``, and the ghost shell it needs (``ghost_cutoff``: ``layers x cutoff`` for
    ``shell``, else one cutoff)."""

    name: str
    layers: int
    cutoff: float
    ghost_cutoff: float

    @property
    def exchange(self) -> bool:
        """Ghost rows are refreshed from their owners after each layer."""
        return self.name == "exchange"

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_strategy(spec: ModelSpec, asked: str, model: str = "this") -> Strategy:
    """The strategy ``pair_style ... strategy ASKED`` runs for a model of ``spec``: a
    strictly local model (one layer) needs neither and ignores the choice; ``auto`` is the
    spec's first.

    :param model: the model's name, for the message
    :raises ValueError: the model does not support ``asked``
    """
    if spec.layers == 1:
        name = "local"
    elif asked == "auto":
        name = spec.strategies[0]
    elif asked in spec.strategies:
        name = asked
    else:
        raise ValueError(
            f"the {model} model does not support strategy {asked} "
            f"(it supports: {', '.join(spec.strategies)})"
        )
    ghost = spec.interaction_range if name == "shell" else spec.cutoff
    return Strategy(name, int(spec.layers), float(spec.cutoff), float(ghost))
