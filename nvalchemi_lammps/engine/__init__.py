"""The engine: the one place where a front door's arrays meet a potential."""

from ._captured import CapturedPotential, capture_potential
from ._compiled import CompiledPotential, compile_potential
from ._evaluate import (
    Evaluation,
    evaluate,
    optimize_torchscript,
    potential_device,
    takes_half_pairs,
)

__all__ = [
    "CapturedPotential",
    "CompiledPotential",
    "Evaluation",
    "capture_potential",
    "compile_potential",
    "evaluate",
    "optimize_torchscript",
    "potential_device",
    "takes_half_pairs",
]
