"""nvalchemi-lammps: machine-learned interatomic potentials in LAMMPS, exact across MPI ranks.

LAMMPS decomposes space, keeps ghost atoms, builds neighbor lists and integrates; the
``pair_style nvalchemi`` plugin hands each rank's owned and ghost atoms to a potential and
returns energies, forces and virial.
"""

from importlib.metadata import PackageNotFoundError, version

from ._elements import map_elements
from ._model_file import FORMAT_VERSION, ModelFileError, load_model, save_model
from .contract import Comm, LocalGraph, ModelSpec, NoOpComm
from .engine import Evaluation, evaluate
from .potentials import LennardJones, MessagePassing, Potential

try:
    __version__ = version("nvalchemi-lammps")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "FORMAT_VERSION",
    "Comm",
    "Evaluation",
    "LennardJones",
    "LocalGraph",
    "MessagePassing",
    "ModelFileError",
    "ModelSpec",
    "NoOpComm",
    "Potential",
    "evaluate",
    "load_model",
    "map_elements",
    "save_model",
]
