"""The settings of ``pair_style mliap unified``, in one place.

LAMMPS's ML-IAP style takes no keywords for the model (``pair_style mliap unified FILE 0``
hands it a file name only), so what ``pair_style nvalchemi`` takes as keywords comes from
the environment here: read once, at the model's first call, and compared across ranks
there (a rank started with another value stops the run). Set them for every rank
(``mpirun -x NAME=VALUE`` with Open MPI, ``-genv NAME VALUE`` with MPICH; Slurm passes the
environment on).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

#: ``torch.compile`` mode of the model, as ``pair_style nvalchemi``'s ``compile MODE``
#: (``default``, ``reduce-overhead``, ``max-autotune``, ``max-autotune-no-cudagraphs``;
#: unset or ``no``: eager). It changes the numbers at rounding level: compared across ranks.
COMPILE_ENV = "NVALCHEMI_LAMMPS_COMPILE"
#: CUDA-graph capture of the model, as ``pair_style nvalchemi``'s ``capture yes|no``: ``yes``
#: (the model's forward and backward captured as CUDA graphs on graphs padded to capacities;
#: on the CPU the same padded buffers without graphs), ``no``, or ``auto`` (unset: the
#: default), on a GPU unless :data:`COMPILE_ENV` compiles. Compared across ranks.
CAPTURE_ENV = "NVALCHEMI_LAMMPS_CAPTURE"
CAPTURE_MODES = ("auto", "yes", "no")
#: How ghost features are exchanged on a single rank, where every ghost is an image of an
#: owned atom: ``gather`` (unset: the default) by each row's owned row, found once per call
#: by one exchange of the rows' numbers through ML-IAP; ``comm`` every exchange through
#: ML-IAP (LAMMPS's communication), to compare. The same numbers either way; on more than
#: one rank every exchange goes through ML-IAP. ``pair_style nvalchemi/kk`` reads it too.
EXCHANGE_ENV = "NVALCHEMI_LAMMPS_EXCHANGE"
EXCHANGE_MODES = ("gather", "comm")


@dataclass(frozen=True)
class MliapSettings:
    """What :data:`COMPILE_ENV`, :data:`CAPTURE_ENV` and :data:`EXCHANGE_ENV` ask for.

    :param compile: the ``torch.compile`` mode, ``no`` for eager (checked when compiling)
    :param exchange: one of :data:`EXCHANGE_MODES`
    :param capture: one of :data:`CAPTURE_MODES`
    """

    compile: str = "no"
    exchange: str = "gather"
    capture: str = "auto"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> MliapSettings:
        """The settings of ``environ``.

        :raises ValueError: an exchange mode not in :data:`EXCHANGE_MODES`, a capture mode
            not in :data:`CAPTURE_MODES`
        """
        exchange = environ.get(EXCHANGE_ENV, "gather")
        if exchange not in EXCHANGE_MODES:
            raise ValueError(f"{EXCHANGE_ENV} must be gather or comm, not '{exchange}'")
        capture = environ.get(CAPTURE_ENV, "auto")
        if capture not in CAPTURE_MODES:
            raise ValueError(f"{CAPTURE_ENV} must be yes, no or auto, not '{capture}'")
        return cls(environ.get(COMPILE_ENV, "no"), exchange, capture)
