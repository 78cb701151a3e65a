"""The MPI that LAMMPS runs on, as the ML-IAP door sees it: mpi4py's ``COMM_WORLD``.

ML-IAP hands a model no communicator. LAMMPS has started MPI before it calls the model, and
mpi4py (>= 4: one wheel for MPICH and Open MPI, which opens the MPI library the process has
already loaded) wraps that same library, so its ``COMM_WORLD`` is the world LAMMPS runs in.
With ``-partition`` that world holds every partition, not one LAMMPS: the door's few
collectives (:func:`allgather` at the first call) then span the partitions.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any


def _mpi_running() -> bool:
    """MPI is loaded into this process, initialized and not finalized (asked of the library
    LAMMPS loaded, so that a process without MPI never loads one)."""
    try:
        lib = ctypes.CDLL(None)
        flag = ctypes.c_int(0)
        if lib.MPI_Initialized(ctypes.byref(flag)) != 0 or not flag.value:
            return False
        return lib.MPI_Finalized(ctypes.byref(flag)) == 0 and not flag.value
    except (OSError, AttributeError):  # no MPI library in this process
        return False


def world() -> Any | None:
    """mpi4py's ``COMM_WORLD`` while MPI runs in this process, ``None`` without MPI (a
    Python without LAMMPS, or a LAMMPS built without MPI).

    :raises ImportError: MPI runs but mpi4py is not installed
    """
    if not _mpi_running():
        return None
    if "mpi4py.MPI" not in sys.modules:
        try:
            import mpi4py
        except ImportError as missing:
            raise ImportError(
                "pair_style mliap unified with nvalchemi-lammps needs mpi4py on the MPI "
                "LAMMPS runs on: pip install 'mpi4py>=4'"
            ) from missing
        # LAMMPS owns MPI: mpi4py neither starts nor finalizes it, and keeps MPI's own
        # error handler on COMM_WORLD (its default would make LAMMPS's MPI errors return)
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        mpi4py.rc.errors = "default"
    from mpi4py import MPI

    return MPI.COMM_WORLD


def rank() -> int:
    """This MPI rank, 0 without MPI (LAMMPS's screen is rank 0's)."""
    comm = world()
    return 0 if comm is None else comm.Get_rank()


def size() -> int:
    """The number of MPI ranks, 1 without MPI."""
    comm = world()
    return 1 if comm is None else comm.Get_size()


def allgather(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (``[value]`` without MPI): collective."""
    comm = world()
    return [value] if comm is None else comm.allgather(value)


def abort() -> None:
    """End every rank now, as LAMMPS's ``error->one`` does (nothing without MPI)."""
    comm = world()
    if comm is not None:
        comm.Abort(1)
