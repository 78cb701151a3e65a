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
#: How ghost features are exchanged on a single rank, where every ghost is an image of an
#: owned atom: ``gather`` (unset: the default) by each row's owned row, found once per call
#: by one exchange of the rows' numbers through ML-IAP; ``comm`` every exchange through
#: ML-IAP (LAMMPS's communication), to compare. The same numbers either way; on more than
#: one rank every exchange goes through ML-IAP. ``pair_style nvalchemi/kk`` reads it too.
EXCHANGE_ENV = "NVALCHEMI_LAMMPS_EXCHANGE"
EXCHANGE_MODES = ("gather", "comm")


@dataclass(frozen=True)
class MliapSettings:
    """What :data:`COMPILE_ENV` and :data:`EXCHANGE_ENV` ask for.

    :param compile: the ``torch.compile`` mode, ``no`` for eager (checked when compiling)
    :param exchange: one of :data:`EXCHANGE_MODES`
    """

    compile: str = "no"
    exchange: str = "gather"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> MliapSettings:
        """The settings of ``environ``.

        :raises ValueError: an exchange mode not in :data:`EXCHANGE_MODES`
        """
        exchange = environ.get(EXCHANGE_ENV, "gather")
        if exchange not in EXCHANGE_MODES:
            raise ValueError(f"{EXCHANGE_ENV} must be gather or comm, not '{exchange}'")
        return cls(environ.get(COMPILE_ENV, "no"), exchange)
