"""nvalchemi-lammps: machine-learned interatomic potentials in LAMMPS, exact across MPI ranks.

LAMMPS decomposes space, keeps ghost atoms, builds neighbor lists and integrates; the
``pair_style nvalchemi`` plugin hands each rank's owned and ghost atoms to a potential and
returns energies, forces and virial.

The public names are imported on first use: the ``lammps`` launcher imports this package
for its plugin entry point on every rank, and must not pay for importing torch there.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("nvalchemi-lammps")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

_EXPORTS = {
    "FORMAT_VERSION": "._model_file",
    "ModelFileError": "._model_file",
    "load_model": "._model_file",
    "save_model": "._model_file",
    "map_elements": "._elements",
    "Comm": ".contract",
    "LocalGraph": ".contract",
    "ModelSpec": ".contract",
    "NoOpComm": ".contract",
    "Evaluation": ".engine",
    "evaluate": ".engine",
    "AIMNet2": ".potentials",
    "DFTD3": ".potentials",
    "Ewald": ".potentials",
    "LennardJones": ".potentials",
    "Mace": ".potentials",
    "MessagePassing": ".potentials",
    "Pipeline": ".potentials",
    "Pme": ".potentials",
    "ToolkitLennardJones": ".potentials",
    "Uma": ".potentials",
    "Potential": ".potentials",
}

__all__ = [
    "DFTD3",
    "FORMAT_VERSION",
    "AIMNet2",
    "Comm",
    "Evaluation",
    "Ewald",
    "LennardJones",
    "LocalGraph",
    "Mace",
    "MessagePassing",
    "ModelFileError",
    "ModelSpec",
    "NoOpComm",
    "Pipeline",
    "Pme",
    "Potential",
    "ToolkitLennardJones",
    "Uma",
    "evaluate",
    "load_model",
    "map_elements",
    "save_model",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
