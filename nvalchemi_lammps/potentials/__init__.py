"""Potentials: torch modules that turn a :class:`~nvalchemi_lammps.contract.LocalGraph` into
per-atom energies. They know physics, not LAMMPS or MPI.

Model packages (mace-torch, aimnet, nvalchemi-toolkit-ops, fairchem-core) are imported only when a model
that needs them is built or loaded.
"""

from ._base import Potential, potential_class, register_potential
from .aimnet2 import AIMNet2
from .dftd3 import DFTD3
from .ewald import Ewald
from .lennard_jones import LennardJones
from .mace import Mace
from .message_passing import MessagePassing
from .pipeline import Pipeline
from .pme import Pme
from .toolkit_lennard_jones import ToolkitLennardJones
from .uma import Uma

__all__ = [
    "DFTD3",
    "AIMNet2",
    "Ewald",
    "LennardJones",
    "Mace",
    "MessagePassing",
    "Pipeline",
    "Pme",
    "Potential",
    "ToolkitLennardJones",
    "Uma",
    "potential_class",
    "register_potential",
]
