"""The data contract between a LAMMPS front door and a potential.

A front door (the ``pair_style nvalchemi`` plugin, or ML-IAP) fills a :class:`LocalGraph`
for one MPI rank and one step; a potential turns it into per-atom energies. Neither side
knows the other.
"""

from ._comm import Comm, NoOpComm, with_adjoint
from ._graph import LocalGraph
from ._spec import STRATEGIES, UNIT_STYLES, ModelSpec

__all__ = [
    "STRATEGIES",
    "UNIT_STYLES",
    "Comm",
    "LocalGraph",
    "ModelSpec",
    "NoOpComm",
    "with_adjoint",
]
