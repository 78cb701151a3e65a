"""The engine: the one place where a front door's arrays meet a potential."""

from ._captured import SHRINK_ABOVE, CapturedPotential, capture_potential
from ._compiled import CompiledPotential, compile_potential
from ._evaluate import (
    Evaluation,
    evaluate,
    optimize_torchscript,
    potential_device,
    takes_half_pairs,
)
from ._evaluation import Readback

__all__ = [
    "SHRINK_ABOVE",
    "CapturedPotential",
    "CompiledPotential",
    "Evaluation",
    "Readback",
    "capture_potential",
    "compile_potential",
    "evaluate",
    "optimize_torchscript",
    "potential_device",
    "takes_half_pairs",
]
