"""The system's net charge as models that predict charges take it."""

from __future__ import annotations

import math

#: Net charges further than this from an integer are refused.
CHARGE_TOLERANCE = 1e-6
#: The largest |net charge| accepted (UMA's charge embedding ends there).
MAX_CHARGE = 100


def checked_total_charge(charge: float) -> float:
    """``charge`` (``pair_style ... charge Q``), refused unless finite, an integer number of e
    (within :data:`CHARGE_TOLERANCE`) and at most :data:`MAX_CHARGE` in magnitude."""
    if not (math.isfinite(charge) and abs(charge) <= MAX_CHARGE):
        raise ValueError(f"total charge must be finite and at most {MAX_CHARGE} e, got {charge}")
    if abs(charge - round(charge)) > CHARGE_TOLERANCE:
        raise ValueError(f"total charge must be an integer number of e, got {charge}")
    return charge
