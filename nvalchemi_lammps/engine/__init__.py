"""The engine: the one place where a front door's arrays meet a potential."""

from ._captured import CapturedPotential, PairSink, capture_potential
from ._compiled import CompiledPotential, compile_potential
from ._evaluate import (
    Evaluation,
    evaluate,
    optimize_torchscript,
    pair_sink,
    potential_device,
    takes_half_pairs,
)
from ._evaluation import Readback

__all__ = [
    "CapturedPotential",
    "CompiledPotential",
    "Evaluation",
    "PairSink",
    "Readback",
    "capture_potential",
    "compile_potential",
    "evaluate",
    "optimize_torchscript",
    "pair_sink",
    "potential_device",
    "takes_half_pairs",
]
