"""The engine: the one place where a front door's arrays meet a potential."""

from ._compiled import CompiledPotential, compile_potential
from ._evaluate import (
    Evaluation,
    evaluate,
    optimize_torchscript,
    potential_device,
    takes_half_pairs,
)

__all__ = [
    "CompiledPotential",
    "Evaluation",
    "compile_potential",
    "evaluate",
    "optimize_torchscript",
    "potential_device",
    "takes_half_pairs",
]
