"""The data contract between a LAMMPS front door and a potential.

A front door (the ``pair_style nvalchemi`` plugin, or ML-IAP) fills a :class:`LocalGraph`
for one MPI rank and one step; a :class:`Potential` turns it into per-atom energies. Neither
side knows the other: every hook of a potential is declared on :class:`Potential`.
"""

from ._comm import AdjointComm, Comm, NoOpComm, with_adjoint
from ._graph import LocalGraph
from ._potential import Potential, check_keys
from ._spec import STRATEGIES, UNIT_STYLES, ModelSpec
from ._strategy import REPORT_ENV, Strategy, resolve_strategy

__all__ = [
    "REPORT_ENV",
    "STRATEGIES",
    "UNIT_STYLES",
    "AdjointComm",
    "Comm",
    "LocalGraph",
    "ModelSpec",
    "NoOpComm",
    "Potential",
    "Strategy",
    "check_keys",
    "resolve_strategy",
    "with_adjoint",
]
