"""Models with random weights for the benchmark configurations in ``configs/`` (named there
as ``python: "../models.py:<function>"``)."""

from __future__ import annotations

import sys
from pathlib import Path


def small_mace(dtype: str = "float32"):
    """The small random MACE of the tests (r_max 4, 2 layers, 8x0e+8x1o, Ar/Kr)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from _mace_models import random_mace

    from nvalchemi_lammps.potentials.mace import Mace

    return Mace.from_model(random_mace(), dtype=dtype)


def random_aimnet2(elements: list[str], dtype: str = "float32"):
    """AIMNet2 with random weights from aimnet's packaged architecture."""
    from nvalchemi_lammps.potentials.aimnet2 import AIMNet2

    return AIMNet2.random_weights(elements, seed=0, dtype=dtype)
