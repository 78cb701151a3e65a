"""The engine: the one place where a front door's arrays meet a potential."""

from ._evaluate import Evaluation, evaluate, potential_device

__all__ = ["Evaluation", "evaluate", "potential_device"]
