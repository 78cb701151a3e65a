"""The checks that need an NVIDIA GPU (marker ``gpu``): every test here is marked, and skips
with its reason where no CUDA device (or no KOKKOS CUDA LAMMPS) is found. On a device:

    .venv/bin/python -m pytest -m gpu tests/gpu

The tests' helpers live one folder up."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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
