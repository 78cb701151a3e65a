"""The terms and the system the pipeline tests share (tests/test_pipeline.py and
tests/test_lammps_pipeline_lj_mp_ewald.py)."""

from __future__ import annotations

import numpy as np

from nvalchemi_lammps import Ewald, LennardJones, MessagePassing

ELEMENTS = ["Ar", "Kr"]


def lennard_jones(dtype: str = "float64") -> LennardJones:
    return LennardJones(
        ELEMENTS,
        epsilon={"Ar": 0.0104, "Kr": 0.014},
        sigma={"Ar": 3.40, "Kr": 3.65},
        cutoff=6.0,
        dtype=dtype,
    )


def message_passing(dtype: str = "float64") -> MessagePassing:
    return MessagePassing(ELEMENTS, cutoff=4.0, layers=2, features=8, seed=3, dtype=dtype)


def ewald() -> Ewald:
    return Ewald(ELEMENTS, cutoff=6.0, alpha=0.45, kmax=5, charges={"Ar": 0.4, "Kr": -0.4})


def terms() -> list:
    return [lennard_jones(), message_passing(), ewald()]


def system(cells: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A jittered fcc box with equal numbers of Ar and Kr (neutral under ``ewald()``)."""
    fcc = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 3)
    frac = (grid[:, None, :] + fcc[None]).reshape(-1, 3) / cells
    cell = np.diag([cells * 5.3, cells * 5.4, cells * 5.5])
    rng = np.random.default_rng(seed)
    positions = frac @ cell + rng.normal(0.0, 0.15, size=frac.shape)
    species = rng.permutation(np.arange(len(frac)) % 2)
    return positions, cell, species
