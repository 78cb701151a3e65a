"""How far an atom's energy really reaches: the receptive-field probe of ``validate``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .contract import Potential
    from .reference import ReferenceResult

#: The receptive-field probe: one atom is moved this far (length) and every atom whose
#: energy changes by more than REACH_THRESHOLD x the largest change counts as reached, unless
#: that is below rounding: REACH_ROUNDING x the model's machine epsilon x the largest
#: per-atom energy (matrix products may round differently when the number of pairs changes).
REACH_DISPLACEMENT = 0.05
REACH_THRESHOLD = 1e-9
REACH_ROUNDING = 64.0


def min_image_distances(positions: np.ndarray, cell: np.ndarray, point: np.ndarray) -> np.ndarray:
    """Distance of every atom to the nearest periodic image of ``point``."""
    frac = (positions - point) @ np.linalg.inv(cell)
    frac -= np.round(frac)
    shifts = np.array(np.meshgrid([-1, 0, 1], [-1, 0, 1], [-1, 0, 1], indexing="ij"))
    shifts = shifts.reshape(3, -1).T
    vectors = (frac[:, None, :] + shifts[None]) @ cell
    return np.linalg.norm(vectors, axis=2).min(axis=1)


def measure_reach(
    potential: Potential,
    positions: np.ndarray,
    cell: np.ndarray,
    species: np.ndarray,
    reference: ReferenceResult,
) -> tuple[int, float]:
    """How far an atom's energy really reaches: moves the first mapped atom by
    ``REACH_DISPLACEMENT`` and returns (its index, the largest distance of an atom whose
    energy changed). A lower bound of the model's receptive field (also bounded by the
    box)."""
    import torch

    from .reference import evaluate_reference

    atom = int(np.flatnonzero(species >= 0)[0])
    moved = positions.copy()
    moved[atom] += REACH_DISPLACEMENT * np.array([1.0, 2.0, 3.0]) / math.sqrt(14.0)
    after = evaluate_reference(potential, moved, cell, (True, True, True), species)
    change = np.abs(after.atom_energies - reference.atom_energies)
    epsilon = float(torch.finfo(potential.spec.torch_dtype).eps)
    rounding = REACH_ROUNDING * epsilon * float(np.abs(reference.atom_energies).max())
    reached = change > max(REACH_THRESHOLD * change.max(), rounding)
    if not reached.any():
        return atom, 0.0
    # an atom counts as close as it came to the moved one, before or after the move
    distances = np.minimum(
        min_image_distances(positions, cell, positions[atom]),
        min_image_distances(positions, cell, moved[atom]),
    )
    return atom, float(distances[reached].max())
