"""Benchmark a model through pair_style nvalchemi from a configuration file.

For each system size and rank count: step 0 (forces by atom ID and energy, each rank count
against the first), then an NVT run timed after a warm-up. Reported per run: ms per step
(slowest rank, median over repeats), atom-steps/s, ns/day, and the step split into LAMMPS
(neighbor lists, integration, communication of positions and forces), bridge (the plugin's
copies between LAMMPS and torch), model (the potential's forward and backward without its
collectives) and collectives (ghost exchanges and sums over ranks); peak memory per rank;
with ``compile``, the graphs compiled during the timed steps.

The configuration (YAML, or TOML) names the model and the runs, e.g.

    name: lj-argon
    model: {file: argon.pt}       # or {python: "models.py:build", args: {...}},
                                  # or an export configuration (potential = ... and keys)
    lattice: fcc:5.26             # KIND:A; sizes are approximate atom counts
    atoms: [1000, 8000]
    elements: [Ar]                # one per LAMMPS type
    ranks: [1, 2, 4]
    steps: 50                     # also: warmup, repeats, device, strategy, compile, units,
                                  # timestep, temperature, threads, tolerance, types
                                  # (random; checkerboard: rock salt on an even sc lattice)

Paths in the configuration are relative to its own folder. Results go to
``--out`` as ``bench_<name>.json`` and a plot ``bench_<name>.png`` (atom-steps/s against
atoms, one line per rank count).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._command import subcommand_main

HELP = "time a model through LAMMPS at several sizes and rank counts (YAML config)"

#: Timestep per unit style in that style's time unit, and that unit in nanoseconds.
_TIMESTEP = {"metal": 0.001, "real": 1.0}
_NS_PER_TIME_UNIT = {"metal": 1e-3, "real": 1e-6}
_RUN_TIMEOUT = 3600.0


@dataclass(frozen=True)
class BenchConfig:
    name: str
    model: dict[str, Any]
    lattice: str
    atoms: list[int]
    elements: list[str]
    ranks: list[int] = field(default_factory=lambda: [1, 2, 4])
    steps: int = 50
    warmup: int = 5
    repeats: int = 3
    device: str = "cpu"
    strategy: str = "auto"
    compile: str = "no"  # pair_style ... compile MODE
    units: str = "metal"
    timestep: float | None = None
    temperature: float = 300.0
    threads: int = 1
    types: str = "random"  # or "checkerboard": rock salt from an sc lattice of even size
    tolerance: float | None = None  # step-0 agreement across ranks; from the dtype if None
    folder: Path = Path(".")


def read_bench_config(path: Path) -> BenchConfig:
    """:raises ValueError: unreadable file, unknown or missing keys, bad values"""
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(
                "YAML configurations need PyYAML: pip install 'nvalchemi-lammps[bench]'"
            ) from None
        data = yaml.safe_load(text)
    else:
        data = tomllib.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of keys")  # noqa: TRY004 (a user's file)
    known = {f for f in BenchConfig.__dataclass_fields__ if f != "folder"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}")
    missing = [k for k in ("name", "model", "lattice", "atoms", "elements") if k not in data]
    if missing:
        raise ValueError(f"{path}: missing key(s) {', '.join(missing)}")
    config = BenchConfig(**data, folder=path.resolve().parent)
    if config.types not in ("random", "checkerboard"):
        raise ValueError(f"{path}: types must be random or checkerboard")
    if config.units not in _TIMESTEP:
        raise ValueError(f"{path}: units must be one of {', '.join(_TIMESTEP)}")
    if min(config.ranks) < 1 or min(config.atoms) < 1 or config.steps < 1 or config.repeats < 1:
        raise ValueError(f"{path}: ranks, atoms, steps and repeats must be positive")
    return config


def build_model(config: BenchConfig, path: Path):
    """Write the configured model to ``path``; returns the potential."""
    from .._model_file import load_model, save_model
    from ..potentials._config import potential_from_config

    model = dict(config.model)
    if "file" in model:
        potential = load_model(config.folder / model["file"])
    elif "python" in model:
        file, _, function = str(model["python"]).partition(":")
        spec = importlib.util.spec_from_file_location("bench_models", config.folder / file)
        if spec is None or not function:
            raise ValueError(f"model.python must be FILE.py:FUNCTION, got {model['python']}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        potential = getattr(module, function)(**model.get("args", {}))
    else:
        potential = potential_from_config(model)
    save_model(potential, path)
    return potential


def _setup_script(config: BenchConfig, data: Path, model: Path, masses: list[float]) -> str:
    dt = config.timestep or _TIMESTEP[config.units]
    lines = [
        f"units {config.units}",
        "atom_style atomic",
        "atom_modify map array",
        f"read_data {data}",
        *(f"mass {k + 1} {m!r}" for k, m in enumerate(masses)),
        (
            f"pair_style nvalchemi {model} device {config.device} "
            f"strategy {config.strategy} compile {config.compile}"
        ),
        f"pair_coeff * * {' '.join(config.elements)}",
        f"timestep {dt!r}",
        f"velocity all create {config.temperature!r} 4928459 loop geom",
        f"fix nvt all nvt temp {config.temperature!r} {config.temperature!r} {100 * dt!r}",
        "thermo 0",
        "dump step0 all custom 1 step0.dump id fx fy fz",
        'dump_modify step0 sort id format float "%.17g"',
        "run 0",
        "undump step0",
    ]
    return "\n".join(lines) + "\n"


def _run_ranks(config: BenchConfig, setup: str, ranks: int, workdir: Path) -> dict[str, Any]:
    from ..lammps_run import read_dump, run_command

    workdir.mkdir(parents=True, exist_ok=True)
    spec = {"setup": setup, "warmup": config.warmup, "steps": config.steps}
    (workdir / "run.json").write_text(json.dumps(spec))
    mpirun = Path(sys.executable).parent / "mpirun"
    cmd = [str(mpirun), "-np", str(ranks), sys.executable, "-m", __package__ + "._bench_worker"]
    # liblammps needs the MPICH wheel's libmpi.so.12, next to this interpreter's lib/
    env = {"OMP_NUM_THREADS": str(config.threads), "LD_LIBRARY_PATH": _library_path()}
    run = run_command([*cmd, "run.json"], workdir, timeout=_RUN_TIMEOUT, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"the run on {ranks} rank(s) failed:\n{run.output[-3000:]}")
    per_rank = [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(ranks)]
    return {"ranks": per_rank, "step0": read_dump(workdir / "step0.dump")}


def _library_path() -> str:
    import os

    libdir = str(Path(sys.executable).parent.parent / "lib")
    current = os.environ.get("LD_LIBRARY_PATH", "")
    return f"{libdir}:{current}" if current else libdir


@dataclass
class Row:
    atoms: int
    ranks: int
    ms_per_step: float
    atom_steps_per_s: float
    ns_per_day: float
    lammps_ms: float
    bridge_ms: float
    model_ms: float
    collectives_ms: float
    peak_host_mib: float
    peak_gpu_mib: float | None
    force_difference: float  # max|F - F_first| / max|F_first| at step 0, by atom ID
    compiled: int | None = None  # graphs compiled during the timed steps (compile), any rank


def _row(config: BenchConfig, atoms: int, ranks: int, repeats: list[dict], first) -> Row:
    import numpy as np

    steps = config.steps

    def per_step(key: str) -> float:
        # slowest rank of each repeat, median over repeats
        return statistics.median(1e3 * max(r.get(key, 0.0) for r in rep) / steps for rep in repeats)

    step, plugin, model, collectives = (
        per_step(k) for k in ("seconds", "plugin", "model", "collectives")
    )
    dt = config.timestep or _TIMESTEP[config.units]
    gpu = [r["peak_gpu_mib"] for rep in repeats for r in rep if "peak_gpu_mib" in r]
    compiled = [r["compiled"] for rep in repeats for r in rep if "compiled" in r]
    columns = ("fx", "fy", "fz")
    forces = np.stack([repeats[0][0]["step0"][c] for c in columns], axis=1)
    reference = np.stack([first[c] for c in columns], axis=1)
    scale = float(np.abs(reference).max()) or 1.0
    return Row(
        atoms=atoms,
        ranks=ranks,
        ms_per_step=step,
        atom_steps_per_s=atoms / (step * 1e-3),
        ns_per_day=dt * _NS_PER_TIME_UNIT[config.units] * 86400.0 / (step * 1e-3),
        lammps_ms=step - plugin,
        bridge_ms=plugin - model,
        model_ms=model - collectives,
        collectives_ms=collectives,
        peak_host_mib=max(r["peak_host_mib"] for rep in repeats for r in rep),
        peak_gpu_mib=max(gpu) if gpu else None,
        force_difference=float(np.abs(forces - reference).max()) / scale,
        compiled=max(compiled) if compiled else None,
    )


def _progress(done: int, total: int, what: str) -> None:
    width = 30
    filled = round(width * done / total)
    end = "\n" if done == total or not sys.stderr.isatty() else "\r"
    sys.stderr.write(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what}{end}")
    sys.stderr.flush()


def format_rows(rows: list[Row]) -> list[str]:
    """The table; with a compiled model, a last column of the graphs compiled during the
    timed steps (0 when the capacities of the first steps held)."""
    compiling = any(r.compiled is not None for r in rows)
    header = (
        f"{'atoms':>9} {'ranks':>5} {'ms/step':>9} {'atom-steps/s':>13} {'ns/day':>9} "
        f"{'lammps':>8} {'bridge':>8} {'model':>8} {'collect.':>8} {'MiB/rank':>9} "
        f"{'dF(step0)':>10}" + (f" {'compiled':>8}" if compiling else "")
    )
    lines = [header]
    for r in rows:
        memory = r.peak_gpu_mib if r.peak_gpu_mib is not None else r.peak_host_mib
        lines.append(
            f"{r.atoms:>9} {r.ranks:>5} {r.ms_per_step:>9.2f} {r.atom_steps_per_s:>13.4g} "
            f"{r.ns_per_day:>9.4g} {r.lammps_ms:>8.2f} {r.bridge_ms:>8.2f} {r.model_ms:>8.2f} "
            f"{r.collectives_ms:>8.2f} {memory:>9.0f} {r.force_difference:>10.1e}"
            + (f" {r.compiled if r.compiled is not None else '-':>8}" if compiling else "")
        )
    return lines


def plot(rows: list[Row], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for ranks in sorted({r.ranks for r in rows}):
        mine = sorted((r for r in rows if r.ranks == ranks), key=lambda r: r.atoms)
        ax.plot([r.atoms for r in mine], [r.atom_steps_per_s for r in mine], "o-", label=f"{ranks}")
    ax.set(xscale="log", yscale="log", xlabel="atoms", ylabel="atom-steps / s", title=title)
    ax.legend(title="ranks")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, metavar="CONFIG.yaml", help="benchmark configuration")
    parser.add_argument(
        "--out", type=Path, default=Path("."), help="folder for the JSON results and the plot"
    )
    parser.add_argument("--no-plot", action="store_true", help="write no PNG plot")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..tools.structures import build_lattice, element_masses, parse_lattice

    try:
        config = read_bench_config(args.config)
        kind, _, constant = config.lattice.partition(":")
        probe = parse_lattice(f"{kind}:{constant}:1")
    except ValueError as err:
        print(f"error: {err}")
        return 2
    masses = element_masses(config.elements, needed=True)
    per_cell = len(build_lattice(probe, 1, 0)[0])
    rows: list[Row] = []
    failed = []
    args.out.mkdir(parents=True, exist_ok=True)
    result = args.out / f"bench_{config.name}.json"
    settings = {k: v for k, v in asdict(config).items() if k != "folder"}
    with tempfile.TemporaryDirectory(prefix="nvalchemi-bench-") as tmp:
        tmp = Path(tmp)
        potential = build_model(config, tmp / "model.pt")
        tolerance = config.tolerance or (1e-10 if potential.spec.dtype == "float64" else 1e-5)
        total, done = len(config.atoms) * len(config.ranks) * config.repeats, 0
        for wanted in config.atoms:
            cells = max(1, round((wanted / per_cell) ** (1.0 / 3.0)))
            lattice = parse_lattice(f"{kind}:{constant}:{cells}")
            positions, cell, types = build_lattice(lattice, len(config.elements), seed=cells)
            if config.types == "checkerboard":
                # alternating types by site parity (rock salt on an even sc lattice):
                # the sites are the positions rounded to the lattice
                sites = np.rint(positions / lattice.constant).astype(int) % cells
                types = sites.sum(axis=1) % len(config.elements) + 1
            from ..lammps_run import write_lammps_data

            data = write_lammps_data(tmp / f"{cells}.data", positions, cell, types, masses)
            setup = _setup_script(config, data, tmp / "model.pt", masses)
            first = None
            for ranks in config.ranks:
                repeats = []
                for k in range(config.repeats):
                    _progress(done, total, f"{len(positions)} atoms, {ranks} rank(s)")
                    out = _run_ranks(config, setup, ranks, tmp / f"{cells}-{ranks}-{k}")
                    repeats.append([{**r, "step0": out["step0"]} for r in out["ranks"]])
                    done += 1
                if first is None:
                    first = repeats[0][0]["step0"]
                row = _row(config, len(positions), ranks, repeats, first)
                if not np.isfinite(row.force_difference) or row.force_difference > tolerance:
                    failed.append(row)
                rows.append(row)
                # after every row, so that a run cut short keeps what it measured
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
