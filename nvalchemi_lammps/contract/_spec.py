from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

#: LAMMPS unit styles a model may declare; the plugin refuses a run in any other.
UNIT_STYLES = ("metal", "real")

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class ModelSpec:
    """What a potential declares to the engine and to LAMMPS.

    :param elements: element names, in the model's own order (species index = position)
    :param cutoff: pair cutoff in the model's length unit; LAMMPS lists pairs with r < cutoff
    :param units: LAMMPS unit style the model's parameters are in (``metal`` or ``real``)
    :param dtype: arithmetic precision of the potential (``float32`` or ``float64``)
    """

    elements: tuple[str, ...]
    cutoff: float
    units: str
    dtype: str = "float64"

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

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def to_dict(self) -> dict:
        return {**asdict(self), "elements": list(self.elements)}

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        return cls(
            elements=tuple(data["elements"]),
            cutoff=float(data["cutoff"]),
            units=data["units"],
            dtype=data.get("dtype", "float64"),
        )
