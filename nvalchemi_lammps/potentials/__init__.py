"""Potentials: torch modules that turn a :class:`~nvalchemi_lammps.contract.LocalGraph` into
per-atom energies. They know physics, not LAMMPS or MPI."""

from ._base import Potential, potential_class, register_potential
from .lennard_jones import LennardJones
from .message_passing import MessagePassing

__all__ = ["LennardJones", "MessagePassing", "Potential", "potential_class", "register_potential"]
