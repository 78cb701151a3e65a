from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

#: LAMMPS unit styles a model may declare; the plugin refuses a run in any other.
UNIT_STYLES = ("metal", "real")

#: Ways a message-passing potential can see past one cutoff on a decomposed system.
STRATEGIES = ("exchange", "shell")

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class ModelSpec:
    """What a potential declares to the engine and to LAMMPS.

    :param elements: element names, in the model's own order (species index = position)
    :param cutoff: pair cutoff in the model's length unit; LAMMPS lists pairs with r < cutoff
    :param units: LAMMPS unit style the model's parameters are in (``metal`` or ``real``)
    :param dtype: arithmetic precision of the potential (``float32`` or ``float64``)
    :param layers: message-passing steps; an atom's energy depends on atoms up to
        ``layers * cutoff`` away (1: strictly local)
    :param strategies: how the potential reaches past one cutoff on a decomposed system,
        in order of preference: ``exchange`` (it calls ``graph.comm.forward_exchange`` on
        ghost rows after each layer; ghost shell of one cutoff) and/or ``shell`` (ghost shell
        of ``layers * cutoff`` with pairs between ghosts, no exchange)
    :param needs_positions: the potential also reads ``graph.positions``, ``graph.cell``
        and ``graph.charges`` (terms that are not pairwise, such as reciprocal-space
        electrostatics); the engine then also returns forces on every atom row and the
        cell part of the virial
    """

    elements: tuple[str, ...]
    cutoff: float
    units: str
    dtype: str = "float64"
    layers: int = 1
    strategies: tuple[str, ...] = STRATEGIES
    needs_positions: bool = False

    def __post_init__(self) -> None:
        if not self.elements:
            raise ValueError("a model needs at least one element")
        if len(set(self.elements)) != len(self.elements):
            raise ValueError(f"duplicate element names in {list(self.elements)}")
        if not self.cutoff > 0.0:
            raise ValueError(f"cutoff must be positive, got {self.cutoff}")
        if self.units not in UNIT_STYLES:
            raise ValueError(f"units must be one of {', '.join(UNIT_STYLES)}; got '{self.units}'")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}; got '{self.dtype}'")
        if int(self.layers) != self.layers or self.layers < 1:
            raise ValueError(f"layers must be a positive integer, got {self.layers}")
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if not self.strategies or unknown:
            raise ValueError(
                f"strategies must be a non-empty subset of {', '.join(STRATEGIES)}; "
                f"got {list(self.strategies)}"
            )

    @property
    def interaction_range(self) -> float:
        """How far an atom's energy reaches: ``layers * cutoff``."""
        return self.layers * self.cutoff

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "elements": list(self.elements),
            "strategies": list(self.strategies),
        }

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        return cls(
            elements=tuple(data["elements"]),
            cutoff=float(data["cutoff"]),
            units=data["units"],
            dtype=data.get("dtype", "float64"),
            layers=int(data.get("layers", 1)),
            strategies=tuple(data.get("strategies", STRATEGIES)),
            needs_positions=bool(data.get("needs_positions", False)),
        )
