"""The Lennard-Jones potential computed by nvalchemiops's Warp kernels, without LAMMPS.

Against the keystone :class:`LennardJones` on a periodic two-element system (explicit
pair, shifted energies, one atom of a NULL type): the same physics, so float64 results
agree to rounding. Through LAMMPS: ``test_lammps_toolkit_lennard_jones.py``.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from nvalchemi_lammps import load_model, save_model
from nvalchemi_lammps.cli.export import potential_from_config
from nvalchemi_lammps.potentials.lennard_jones import LennardJones
from nvalchemi_lammps.potentials.toolkit_lennard_jones import ToolkitLennardJones
from nvalchemi_lammps.reference import evaluate_reference

ARGUMENTS = {
    "elements": ["Ar", "Ne"],
    "epsilon": {"Ar": 0.0104, "Ne": 0.00312},
    "sigma": {"Ar": 3.40, "Ne": 2.74},
    "cutoff": 8.5,
    "pairs": [{"elements": ["Ar", "Ne"], "epsilon": 0.0058, "cutoff": 6.5}],
    "shift": True,
}


def _evaluate(potential):
    rng = np.random.default_rng(0)
    grid = np.stack(np.meshgrid(*[np.arange(4.0)] * 3, indexing="ij"), -1).reshape(-1, 3)
    positions = 3.8 * grid + rng.normal(0.0, 0.2, grid.shape)
    species = rng.integers(0, 2, len(grid))
    species[5] = -1
    return evaluate_reference(potential, positions, np.diag([15.2] * 3), (True,) * 3, species)


def _relative(got, ref) -> float:
    return float(np.max(np.abs(np.asarray(got) - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize(("dtype", "tol"), [("float64", 1e-13), ("float32", 1e-5)])
def test_equals_the_keystone_lennard_jones(dtype, tol):
    ref = _evaluate(LennardJones(**ARGUMENTS, dtype=dtype))
    got = _evaluate(ToolkitLennardJones(**ARGUMENTS, dtype=dtype))
    for name in ("energy", "atom_energies", "forces", "virial", "atom_virials"):
        assert _relative(getattr(got, name), getattr(ref, name)) < tol, name
    assert np.all(got.forces[5] == 0.0)


def test_model_file_and_export(tmp_path):
    potential = potential_from_config({"potential": "toolkit_lennard_jones", **ARGUMENTS})
    assert isinstance(potential, ToolkitLennardJones)
    loaded = load_model(save_model(potential, tmp_path / "lj.pt"))
    assert type(loaded) is ToolkitLennardJones and loaded.config() == potential.config()
    assert _evaluate(loaded).energy == _evaluate(potential).energy


def test_missing_nvalchemiops_is_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvalchemiops.interactions.lj", None)
    message = "potential toolkit_lennard_jones needs nvalchemiops (Warp kernels)"
    with pytest.raises(ImportError, match=re.escape(message)):
        ToolkitLennardJones(**ARGUMENTS)
