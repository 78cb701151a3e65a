"""Potentials: torch modules that turn a :class:`~nvalchemi_lammps.contract.LocalGraph` into
per-atom energies. They know physics, not LAMMPS or MPI."""

from ._base import Potential, potential_class, register_potential
from .ewald import Ewald
from .lennard_jones import LennardJones
from .mace import Mace  # mace-torch itself is imported only when a MACE model is built
from .message_passing import MessagePassing
from .pipeline import Pipeline

__all__ = [
    "Ewald",
    "LennardJones",
    "Mace",
    "MessagePassing",
    "Pipeline",
    "Potential",
    "potential_class",
    "register_potential",
]
