"""A KOKKOS LAMMPS on NVIDIA GPUs: this project's model files through ``pair_style mliap
unified`` (LAMMPS's ML-IAP), through ``pair_style nvalchemi/kk`` (the plugin's KOKKOS
variant) and through ``pair_style nvalchemi`` on the host LAMMPS path: exact, and how fast.

Here, where mace-torch and aimnet are installed (CPU is enough):

    python benchmarks/kokkos_lammps.py prepare DIR

writes model files, LAMMPS data files and single-process references (float64 and float32,
computed without LAMMPS) into DIR. On the GPU machine, with a LAMMPS built by
``tools/build_lammps_kokkos.sh`` at PREFIX (and, for ``--door kk``/``host``, the plugin by
``tools/build_plugin_kokkos.sh`` in PREFIX/plugin-build):

    python benchmarks/kokkos_lammps.py check DIR --lammps PREFIX [--gpus 2] [--door kk]
    python benchmarks/kokkos_lammps.py check DIR --lammps PREFIX --compile default --models mace64
    python benchmarks/kokkos_lammps.py bench DIR --lammps PREFIX --atoms 1000 20000 100000
    python benchmarks/kokkos_lammps.py cueq DIR    # where cuequivariance-ops-torch is installed
    python benchmarks/kokkos_lammps.py bench DIR --lammps PREFIX --kernels cuequivariance

``check`` runs every model both doors can run (Lennard-Jones, a 3-layer message-passing
model, MACE float64 and float32, DFT-D3) with ``-k on g N -sf kk -pk kokkos newton on neigh
half`` on 1 rank, 2 ranks on one GPU, 2 ranks on 2 GPUs and 2 ranks of which one owns no
atoms (on one and on two GPUs), and compares energy, per-atom energies, forces, pressure and
per-atom stress with the reference by atom ID (1e-10 relative in float64, 1e-5 in float32);
then 200 NVE steps of the message-passing model on 2 ranks against 1 rank; ``--compile
MODE``: the same with the models compiled, as ``compile MODE`` (``--door kk``) and
``NVALCHEMI_LAMMPS_COMPILE=MODE`` (``--door mliap``) do. ``bench`` times
the random MACE of docs/performance.md side by side, per size and precision: the bare
model's forward and backward on the whole periodic system in this process (the reference
evaluator's pairs), then LAMMPS steps through each ``--styles``: ``kk`` (``nvalchemi/kk``),
``mliap`` (this project's model file through ML-IAP; ``kk-compile``, ``mliap-compile``: the
same compiled, by ``compile default`` and ``NVALCHEMI_LAMMPS_COMPILE=default``;
``kk-cudagraphs``: ``compile reduce-overhead``, replayed as CUDA graphs),
``mace-torch`` (mace-torch's own ML-IAP class ``LAMMPS_MLIAP_MACE``, same weights) and
``host`` (``pair_style nvalchemi device cuda`` in the same LAMMPS without KOKKOS: atoms on
the host), with the largest GPU
memory seen while each ran, and compares the forces of every style by atom ID (up to
30,000 atoms). MACE runs on e3nn's kernels or (``--kernels cuequivariance``) on
cuEquivariance's for every style: ``cueq`` converts mace-torch's model with mace-torch's own
converter, as ``mace_create_lammps_model --format=mliap`` does, on the GPU machine, since
cuEquivariance fixes its kernels when a model is converted. Both print a table and write
JSON; ``check`` exits 1 if any comparison fails.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shlex
import site
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Self

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import step_profile
from lammps_helpers import (
    GLOBAL,
    PER_ATOM,
    atoms_per_rank,
    comparison_script,
    per_atom,
    relative_difference,
)

from nvalchemi_lammps.lammps_run import (
    LammpsRun,
    read_dump,
    read_results,
    run_command,
    write_lammps_data,
)

KOKKOS = ["-sf", "kk", "-pk", "kokkos", "newton", "on", "neigh", "half"]
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
#: MACE's kernels that bench compares, the same on both sides
KERNELS = ("e3nn", "cuequivariance")
#: The MPI launcher (Open MPI's by default; MPIRUN=mpirun for MPICH's)
MPIRUN = shlex.split(os.environ.get("MPIRUN", "mpirun --oversubscribe"))
#: bench --profile: steps profiled per run, from the compute call FIRST_PROFILED on (past the
#: warm-up run, the dump's run 0 and each run's setup call)
PROFILED, FIRST_PROFILED = 5, 12
#: bench --memory: steps whose memory is followed
MEMORY_STEPS = 3
_LOOP = re.compile(r"^Loop time of (\S+) on \d+ procs for (\d+) steps", re.MULTILINE)


def run_ms_per_step(output: str) -> list[float]:
    """ms/step of each ``run`` of some steps in LAMMPS's output, in order."""
    return [1e3 * float(t) / int(n) for t, n in _LOOP.findall(output) if int(n)]


@dataclass(frozen=True)
class Case:
    """One model on one structure: ``DIR/<name>.pt`` on ``DIR/<structure>.data``."""

    name: str
    structure: str
    elements: str
    dtype: str


CASES = [
    Case("lj", "ar_ne", "Ar Ne", "float64"),
    Case("mpnn", "ar_ne", "Ar Ne", "float64"),
    Case("mace64", "ar_kr", "Ar Kr", "float64"),
    Case("mace32", "ar_kr", "Ar Kr", "float32"),
    Case("d3", "cho", "C H O", "float64"),
]

#: (label, ranks, GPUs, processors grid): the slabs fill the lower 40 % of their box, so
#: splitting along z leaves the upper rank without atoms.
RUNS = [
    ("1 rank", 1, 1, ""),
    ("2 ranks 1 GPU", 2, 1, "processors 2 1 1"),
    ("2 ranks 2 GPUs", 2, 2, "processors 2 1 1"),
    ("2 ranks 1 GPU, one empty", 2, 1, "processors 1 1 2"),
    ("2 ranks 2 GPUs, one empty", 2, 2, "processors 1 1 2"),
]
#: The same on the host (``--gpus 0``)
HOST_RUNS = [
    ("1 rank", 1, 0, ""),
    ("2 ranks", 2, 0, "processors 2 1 1"),
    ("4 ranks, empty ones", 4, 0, "processors 1 1 4"),
]


# ----------------------------------------------------------------------------- prepare


def prepare(out: Path) -> None:
    """Model files, data files and single-process references (no LAMMPS) into ``out``."""
    import torch
    from _mace_models import random_mace
    from _systems import ar_ne_slab
    from test_lammps_dftd3 import random_slab

    from nvalchemi_lammps import LennardJones, MessagePassing, save_model
    from nvalchemi_lammps.potentials.dftd3 import DFTD3
    from nvalchemi_lammps.potentials.mace import Mace
    from nvalchemi_lammps.reference import evaluate_reference

    out.mkdir(parents=True, exist_ok=True)
    positions, cell, species = ar_ne_slab()
    structures = {
        "ar_ne": (positions, cell, species, [39.948, 20.1797]),
        "ar_kr": (positions, cell, species, [39.948, 83.798]),
        "cho": (*random_slab(), [12.011, 1.008, 15.999]),
    }
    for name, (pos, box, spec, masses) in structures.items():
        write_lammps_data(out / f"{name}.data", pos, box, spec + 1, masses)
    # e3nn's basis, which mace-torch otherwise swaps for cuEquivariance's where that is
    # installed: the files then load where it is not (the GPU machines)
    mace = random_mace(use_reduced_cg=False)
    potentials = {
        "lj": LennardJones(
            ["Ar", "Ne"], {"Ar": 0.0104, "Ne": 0.00312}, {"Ar": 3.40, "Ne": 2.74}, cutoff=6.0
        ),
        "mpnn": MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3),
        "mace64": Mace.from_model(mace, dtype="float64"),
        "mace32": Mace.from_model(mace, dtype="float32"),
        "d3": DFTD3(["C", "H", "O"], 7.0, 5.0, functional="pbe"),  # as tests/test_lammps_dftd3.py
    }
    for case in CASES:
        potential = potentials[case.name].eval()
        save_model(potential, out / f"{case.name}.pt")
        pos, box, spec, _ = structures[case.structure]
        ref = evaluate_reference(potential, pos, box, (True, True, True), spec)
        volume = abs(float(np.linalg.det(box)))
        tensor = ref.pressure(volume, units="metal")
        np.savez(
            out / f"{case.name}.ref.npz",
            energy=ref.energy,
            atom_energies=ref.atom_energies,
            forces=ref.forces,
            pressure=tensor[[0, 1, 2, 0, 0, 1], [0, 1, 2, 1, 2, 2]],
            atom_virials=ref.atom_virials,
        )
    # mace-torch's own ML-IAP class on the same weights: what `mace_create_lammps_model
    # --format=mliap` writes, less its conversion to cuEquivariance (not installed there)
    from mace.calculators.lammps_mliap_mace import LAMMPS_MLIAP_MACE

    for dtype, name in ((torch.float64, "mace64_own"), (torch.float32, "mace32_own")):
        model = copy.deepcopy(mace).to(dtype)
        model.lammps_mliap = True
        torch.save(LAMMPS_MLIAP_MACE(model), out / f"{name}.pt")
    # this project's model files for bench, their kernels named (kernels "auto" above)
    for bits in ("32", "64"):
        for kernels in KERNELS:
            mace_file = Mace.from_model(mace, dtype=f"float{bits}", kernels=kernels).eval()
            save_model(mace_file, out / f"mace{bits}_{kernels}.pt")
    print(f"prepared {sorted(p.name for p in out.iterdir())}")


def convert_to_cueq(out: Path) -> None:
    """mace-torch's ML-IAP models of ``prepare`` on cuEquivariance's kernels, converted by
    mace-torch as its ``mace_create_lammps_model --format=mliap`` does (on a machine with
    cuequivariance-ops-torch: without it the converted model keeps the slow reference
    kernels)."""
    import torch
    from mace.calculators.lammps_mliap_mace import LAMMPS_MLIAP_MACE
    from mace.cli.convert_e3nn_cueq import run as run_e3nn_to_cueq

    from nvalchemi_lammps import load_model

    for bits in ("32", "64"):
        # the e3nn network as mace-torch builds it from the file's hyperparameters
        network = load_model(out / f"mace{bits}_e3nn.pt").model
        model = run_e3nn_to_cueq(copy.deepcopy(network))
        model.lammps_mliap = True
        torch.save(LAMMPS_MLIAP_MACE(model), out / f"mace{bits}_own_cuequivariance.pt")
    print("converted mace-torch's models to cuEquivariance")


# ----------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Door:
    """How a model file reaches LAMMPS: ``mliap`` (``pair_style mliap unified``), ``kk``
    (``pair_style nvalchemi``, which ``-sf kk`` makes ``nvalchemi/kk``) or ``host`` (``pair_style
    nvalchemi`` in LAMMPS without KOKKOS: atoms, lists and integration on the host)."""

    name: str

    @property
    def kokkos(self) -> bool:
        return self.name != "host"

    def compiled(self, mode: str) -> tuple[str, dict[str, str]]:
        """The pair style's keywords and the environment that compile a model in ``mode``
        ("no": none)."""
        if mode == "no":
            return "", {}
        if self.name == "mliap":  # ML-IAP's pair style takes no keywords of ours
            return "", {"NVALCHEMI_LAMMPS_COMPILE": mode}
        return f"compile {mode}", {}

    def pair_style(self, model: Path, device: str, extra: str = "") -> str:
        if self.name == "mliap":
            return f"mliap unified {model} 0"
        return f"nvalchemi {model} device {device} {extra}".rstrip()


DOORS = ("mliap", "kk", "host")


@dataclass(frozen=True)
class Lammps:
    """A KOKKOS LAMMPS from tools/build_lammps_kokkos.sh (and the plugin of
    tools/build_plugin_kokkos.sh, when built) and how to start it."""

    prefix: Path
    package: tuple[str, ...] = ()  # more `-pk kokkos` keywords, e.g. ("gpu/aware", "on")

    @property
    def env(self) -> dict[str, str]:
        lib = next(self.prefix.glob("install/lib*/liblammps.so")).parent
        # LAMMPS's embedded Python starts from the system prefix: hand it this environment's
        paths = [
            self.prefix / "python",
            ROOT,
            os.environ.get("PYTHONPATH", ""),
            *site.getsitepackages(),
        ]
        return {
            "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}",
            "PYTHONPATH": ":".join(str(p) for p in paths if str(p)),
            # LAMMPS loads nvalchemiplugin.so from here at start (pair_style nvalchemi[/kk])
            "LAMMPS_PLUGIN_PATH": str(self.prefix / "plugin-build" / "cpp_bridge"),
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }

    def run(
        self,
        script: str,
        ranks: int,
        gpus: int,
        workdir: Path,
        kokkos: bool = True,
        env: dict[str, str] | None = None,
    ) -> LammpsRun:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "in.lammps").write_text(script)
        # gpus 0: a KOKKOS LAMMPS built for the host (tools/build_lammps_kokkos.sh ... SERIAL)
        args = ["-k", "on", *(["g", str(gpus)] if gpus else []), *KOKKOS, *self.package]
        lmp = self.prefix / "install" / "bin" / "lmp"
        cmd = [*MPIRUN, "-np", str(ranks), str(lmp), *(args if kokkos else []), "-in", "in.lammps"]
        return run_command(cmd, workdir, timeout=600, env={**self.env, **(env or {})})


@dataclass
class Row:
    model: str
    run: str
    worst: str
    relative: float
    passed: bool
    detail: str = ""
    exchange: str = ""  # the ways the run's log says ghost features went (both doors say)


def compare(case: Case, run: LammpsRun, ref: dict) -> dict[str, float]:
    """The relative difference from the reference of every quantity."""
    atoms, results = read_dump(run.workdir / "atoms.dump"), read_results(run.output)
    from nvalchemi_lammps.reference import NKTV2P

    pairs = {
        "energy": ([results["pe"]], [float(ref["energy"])]),
        "energy_per_atom": (atoms["c_pe"], ref["atom_energies"]),
        "force": (per_atom(atoms, PER_ATOM["force"]), ref["forces"]),
        "pressure": ([results[p] for p in GLOBAL["pressure"]], ref["pressure"]),
        "stress_per_atom": (
            per_atom(atoms, PER_ATOM["stress_per_atom"]),
            -NKTV2P["metal"] * ref["atom_virials"],
        ),
    }
    return {
        q: relative_difference(q, np.asarray(g), np.asarray(r)).relative
        for q, (g, r) in pairs.items()
    }


def failure(run: LammpsRun) -> str:
    """Why a run stopped: LAMMPS's, Kokkos's or Python's own lines (the whole output is
    kept next to the run)."""
    (run.workdir / "output.txt").write_text(run.output)
    keys = ("ERROR", "Error", "error:", "Kokkos", "abort", "terminate", "what()", "Exception")
    lines = [line for line in run.output.splitlines() if any(k in line for k in keys)]
    return " | ".join(lines[:6] or run.output.strip().splitlines()[-4:])[-600:]


def check(
    data: Path,
    lammps: Lammps,
    door: Door,
    gpus: int,
    models: list[str],
    nve_steps: int,
    compile_mode: str = "no",
) -> list[Row]:
    device = "cuda" if gpus else "cpu"
    extra, env = door.compiled(compile_mode)
    rows = []
    for case in CASES:
        if case.name not in models:
            continue
        ref = dict(np.load(data / f"{case.name}.ref.npz"))
        for label, ranks, ngpu, processors in RUNS if gpus else HOST_RUNS:
            if ngpu > gpus:
                continue
            name = label.replace(" ", "_").replace(",", "")
            workdir = data / "runs" / f"{door.name}-{compile_mode}" / case.name / name
            script = comparison_script(
                str(data / f"{case.structure}.data"),
                door.pair_style(data / f"{case.name}.pt", device, extra),
                case.elements,
                processors,
            )
            run = lammps.run(script, ranks, ngpu, workdir, door.kokkos, env)
            if run.returncode != 0:
                rows.append(Row(case.name, label, "crash", float("nan"), False, failure(run)))
                continue
            diffs = compare(case, run, ref)
            worst, rel = max(diffs.items(), key=lambda item: item[1])
            owned = atoms_per_rank(run.output)[-1]
            empty = "empty" not in label or owned[0] == 0  # the case it is named for
            detail = "" if empty else f"no rank was left without atoms: {owned}"
            way = exchange_ways(run.output)
            passed = empty and rel <= TOLERANCE[case.dtype]
            rows.append(Row(case.name, label, worst, rel, passed, detail, way))
            print(
                f"{case.name:7s} {label:20s} " + " ".join(f"{q} {d:.2e}" for q, d in diffs.items()),
                flush=True,
            )
            if way:
                print(f"{'':28s} {way}", flush=True)
    if nve_steps:
        rows += nve(data, lammps, door, gpus, nve_steps, compile_mode)
    return rows


def exchange_ways(output: str) -> str:
    """The lines of a LAMMPS log that say how ghost features were exchanged, once each."""
    way = re.compile(r"ghost features (gathered|by|through)")
    lines = [line.strip() for line in output.splitlines() if way.search(line)]
    return "; ".join(dict.fromkeys(lines))


def md_script(data: Path, pair_style: str, elements: str, processors: str) -> str:
    """Read ``data``, the pair style, 300 K velocities, NVE."""
    return textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        atom_modify map array
        {processors}
        read_data {data}
        pair_style {pair_style}
        pair_coeff * * {elements}
        velocity all create 300.0 4928 mom yes rot yes
        fix 1 all nve
        """
    )


def nve_script(data: Path, pair_style: str, processors: str, steps: int) -> str:
    return md_script(data, pair_style, "Ar Ne", processors) + textwrap.dedent(
        f"""\
        thermo_style custom step pe ke etotal
        thermo {steps}
        run {steps}
        write_dump all custom final.dump id x y z vx vy vz modify sort id format float %.17g
        print "RESULT etotal $(etotal:%.17g) pe $(pe:%.17g)"
        """
    )


def nve(
    data: Path, lammps: Lammps, door: Door, gpus: int, steps: int = 200, compile_mode: str = "no"
) -> list[Row]:
    """200 NVE steps of the message-passing model: 2 ranks (1 and 2 GPUs) = 1 rank."""
    extra, env = door.compiled(compile_mode)
    pair_style = door.pair_style(data / "mpnn.pt", "cuda" if gpus else "cpu", extra)
    runs = {}
    for label, ranks, ngpu, processors in RUNS[:3] if gpus else HOST_RUNS[:2]:
        if ngpu > gpus:
            continue
        workdir = data / "runs" / f"{door.name}-{compile_mode}" / "nve" / label.replace(" ", "_")
        script = nve_script(data / "ar_ne.data", pair_style, processors, steps)
        runs[label] = lammps.run(script, ranks, ngpu, workdir, door.kokkos, env)
    base = runs.pop("1 rank")
    rows = []
    for label, run in runs.items():
        if run.returncode != 0 or base.returncode != 0:
            why = failure(run if run.returncode else base)
            rows.append(Row("mpnn NVE", label, "crash", float("nan"), False, why))
            continue
        got, ref = read_dump(run.workdir / "final.dump"), read_dump(base.workdir / "final.dump")
        diffs = {
            "positions": relative_difference(
                "x", per_atom(got, ["x", "y", "z"]), per_atom(ref, ["x", "y", "z"])
            ).relative,
            "velocities": relative_difference(
                "v", per_atom(got, ["vx", "vy", "vz"]), per_atom(ref, ["vx", "vy", "vz"])
            ).relative,
            "etotal": abs(read_results(run.output)["etotal"] - read_results(base.output)["etotal"])
            / abs(read_results(base.output)["etotal"]),
        }
        worst = max(diffs, key=diffs.get)
        rows.append(
            Row(
                f"mpnn NVE {steps}",
                f"{label} vs 1 rank",
                worst,
                diffs[worst],
                diffs[worst] <= TOLERANCE["float64"],
            )
        )
        print(f"NVE {label}: {diffs}", flush=True)
    return rows


# ----------------------------------------------------------------------------- bench


#: bench's styles: the door, whose model file (this project's or mace-torch's class), and
#: the torch.compile mode of this project's model ("no": eager; Door.compiled)
STYLES = {
    "kk": (Door("kk"), "nvalchemi", "no"),
    "kk-compile": (Door("kk"), "nvalchemi", "default"),
    "kk-cudagraphs": (Door("kk"), "nvalchemi", "reduce-overhead"),
    "mliap": (Door("mliap"), "nvalchemi", "no"),
    "mliap-compile": (Door("mliap"), "nvalchemi", "default"),
    "mace-torch": (Door("mliap"), "mace-torch", "no"),
    "host": (Door("host"), "nvalchemi", "no"),
    "host-compile": (Door("host"), "nvalchemi", "default"),
}


def model_key(mode: str) -> str:
    """The bare model's ms/step in ``mode`` (a style's step / model is against the bare
    model compiled the same way), a key of bench's model rows."""
    return "ms_per_step" if mode == "no" else f"{mode}_ms_per_step"


def bench_script(
    data: Path, pair_style: str, processors: str, warmup: int, steps: int, repeats: int, dump: bool
) -> str:
    script = md_script(data, pair_style, "Ar Kr", processors) + "thermo 0\n"
    if dump:
        script += "dump d all custom 1 forces.dump id fx fy fz\n"
        script += 'dump_modify d sort id format float "%.17g"\nrun 0\nundump d\n'
    script += f"run {warmup}\n" + f"run {steps}\n" * repeats
    return script


class GpuMemory:
    """The most GPU memory in use (MiB, the fullest GPU; every process on it) while the
    block runs, sampled from nvidia-smi: what a LAMMPS job takes, its CUDA context and
    allocator caches included."""

    def __enter__(self) -> Self:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.wait(0.2):
            try:
                used = subprocess.run(query, capture_output=True, text=True, timeout=5, check=True)
                used = used.stdout
                self.peak = max([self.peak, *(int(v) for v in used.split())])
            except (OSError, ValueError, subprocess.SubprocessError):
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class BareModel:
    """The model's forward and backward on the whole periodic system (the reference
    evaluator's pairs, no LAMMPS), ready to time in whichever process holds it; ``mode``:
    the ``torch.compile`` mode (padded graphs) as the styles of :data:`STYLES` in that mode
    run it, "no": eager."""

    def __init__(self, model_file: Path, system: dict, device: str, mode: str = "no"):
        import torch

        from nvalchemi_lammps import load_model
        from nvalchemi_lammps.engine import compile_potential
        from nvalchemi_lammps.reference import neighbor_pairs

        self.potential = load_model(model_file).to(device)
        if mode != "no":
            self.potential = compile_potential(self.potential, mode)
        self.synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
        if device == "cpu":
            torch.set_num_threads(1)  # as a LAMMPS rank without OMP_NUM_THREADS
        positions, cell = system["positions"], system["cell"]
        pairs = neighbor_pairs(positions, cell, (True, True, True), self.potential.spec.cutoff)
        self.natoms = len(positions)
        self.inputs = [
            torch.as_tensor(system["types"] - 1, device=device),
            *(torch.from_numpy(a).to(device) for a in (pairs.pair_i, pairs.pair_j, pairs.rij)),
        ]
        self.synchronize()

    def __call__(self) -> None:
        from nvalchemi_lammps import LocalGraph, evaluate

        evaluate(self.potential, LocalGraph(self.natoms, *self.inputs))

    def samples(self, calls: int) -> list[float]:
        """ms of each of ``calls`` calls, each to its end (a CUDA synchronization)."""
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            self()
            self.synchronize()
            times.append(1e3 * (time.perf_counter() - start))
        return times


def bare_model(
    model_file: Path,
    system: dict,
    device: str,
    calls: int,
    profile: bool = False,
    mode: str = "no",
) -> dict:
    """The bare model (:class:`BareModel`) in this process: median ms of ``calls`` after one
    warm-up (compiling, in a ``torch.compile`` ``mode`` other than "no"), and the peak
    memory torch allocated (inputs included); with ``profile`` the kernels of
    :data:`PROFILED` more calls (step_profile.py)."""
    import torch

    model = BareModel(model_file, system, device, mode)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        samples = model.samples(calls + 1)
        peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
        row = {"ms_per_step": statistics.median(samples[1:]), "peak_mib": peak}
        if profile:
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as kernels:
                start = time.perf_counter()
                for _ in range(PROFILED):
                    model()
                model.synchronize()
                wall = time.perf_counter() - start
            row["profile"] = step_profile.kernel_table(kernels, PROFILED, wall)
        return row
    except torch.cuda.OutOfMemoryError:
        return {"error": "out of memory"}
    finally:
        del model
        torch.cuda.empty_cache()


def bench(
    data: Path,
    lammps: Lammps,
    sizes: list[int],
    gpus: int,
    steps: int,
    dtypes: list[str],
    kernels: str,
    styles: list[str],
    rounds: int = 1,
    profile: bool = False,
    model_calls: int = 10,
    memory: bool = False,
    phases: bool = False,
) -> list[dict]:
    """ms/step of the random MACE through each style, side by side per size and precision,
    with the bare model's time on one GPU; forces of every style by atom ID against the
    first style's (up to 30,000 atoms). With several ``rounds`` the bare model and every
    style run again per round, every other round in reverse order, and each style's step /
    model is the median of its rounds' ratios to the bare model of the same round: small
    models are launch-bound, and the host's speed moves every time between minutes. With
    ``profile`` each run's kernels per step are set against the bare model's, with
    ``phases`` its host time is split into phases (step_profile.py); with ``model_calls``
    0 no bare model runs (the largest systems: this process holds no GPU memory while
    LAMMPS runs)."""
    from bench_strategies import LATTICE, crystal

    rows = []
    device = "cuda" if gpus else "cpu"  # gpus 0: a KOKKOS LAMMPS for the host
    for atoms in sizes:
        path, system = crystal(atoms, LATTICE["mace"], data / f"bench{atoms}.data")
        natoms = len(system["positions"])
        for dtype in dtypes:
            bits = dtype.removeprefix("float")
            ours = data / f"mace{bits}_{kernels}.pt"
            base = {"atoms": natoms, "dtype": dtype, "kernels": kernels, "gpus": gpus}
            timed = []
            for k in range(rounds):
                model = {**base, "round": k, "style": "model"}
                if model_calls:
                    model |= bare_model(ours, system, device, model_calls, profile)
                    for mode in sorted({STYLES[style][2] for style in styles} - {"no"}):
                        compiled = bare_model(ours, system, device, model_calls, mode=mode)
                        model[model_key(mode)] = compiled.get("ms_per_step")
                rows.append(model)
                shown = {key: v for key, v in model.items() if key != "profile"}
                print(f"{natoms:8d} atoms {dtype} {kernels} bare model: {shown}", flush=True)
                order = styles if k % 2 == 0 else styles[::-1]
                dump = natoms <= 30000 and k == 0
                forces: dict[str, dict] = {}
                for style in order:
                    row = _bench_run(
                        data,
                        lammps,
                        path,
                        style,
                        model,
                        ours,
                        gpus,
                        steps,
                        dump,
                        profile,
                        memory,
                        phases,
                    )
                    rows.append(row)
                    timed.append(row)
                    if dump and "ms_per_step" in row:
                        forces[style] = per_atom(
                            read_dump(Path(row.pop("workdir")) / "forces.dump"), ["fx", "fy", "fz"]
                        )
                        first = next(iter(forces))
                        row["force_difference"] = relative_difference(
                            "force", forces[style], forces[first]
                        ).relative
                    row.pop("workdir", None)
                    print(
                        f"{natoms:8d} atoms {gpus} GPU {dtype} {kernels} {style:12s} "
                        f"{row.get('ms_per_step', float('nan')):8.2f} ms/step step/model "
                        f"{row.get('step_over_model', float('nan')):.2f} peak "
                        f"{row['peak_gpu_mib']} MiB forces vs {next(iter(forces), '-')} "
                        f"{row.get('force_difference', float('nan')):.1e}",
                        flush=True,
                    )
                    if "profile" in row and "profile" in model:
                        print(
                            step_profile.differences(row["profile"], model["profile"]), flush=True
                        )
            if rounds > 1:
                rows += _rounds_summary(base, styles, timed)
    return rows


def _bench_run(
    data: Path,
    lammps: Lammps,
    path: Path,
    style: str,
    model: dict,
    ours: Path,
    gpus: int,
    steps: int,
    dump: bool,
    profile: bool = False,
    memory: bool = False,
    phases: bool = False,
) -> dict:
    """One LAMMPS run of ``style``: median ms/step of 3 runs of ``steps`` steps after 5;
    with ``profile`` the kernels of :data:`PROFILED` of its steps, with ``memory`` the GPU
    memory of ``nvalchemi/kk``'s first steps phase by phase, with ``phases`` the host time
    of :data:`PROFILED` steps phase by phase (step_profile.py)."""
    door, whose, mode = STYLES[style]
    extra, style_env = door.compiled(mode)
    kernels, dtype, natoms = model["kernels"], model["dtype"], model["atoms"]
    own = "" if kernels == "e3nn" else f"_{kernels}"
    bits = dtype.removeprefix("float")
    model_file = data / f"mace{bits}_own{own}.pt" if whose == "mace-torch" else ours
    ranks = max(gpus, 1)
    processors = "" if ranks == 1 else f"processors {ranks} 1 1"
    pair_style = door.pair_style(model_file, "cuda" if gpus else "cpu", extra)
    workdir = data / "runs" / "bench" / f"{natoms}_{style}_{dtype}_{kernels}_{ranks}"
    script = bench_script(path, pair_style, processors, 5, steps, 3, dump)
    env = dict(style_env)
    kernels, memory_file, phases_file = (
        workdir / f"{name}.json" for name in ("profile", "memory", "phases")
    )
    for stale in (kernels, memory_file, phases_file):
        stale.unlink(missing_ok=True)
    if profile:
        env[step_profile.ENV] = f"{kernels}:{FIRST_PROFILED}:{PROFILED}"
    if memory:
        env[step_profile.MEMORY_ENV] = f"{memory_file}:{MEMORY_STEPS}"
    if phases:
        env[step_profile.PHASES_ENV] = f"{phases_file}:{FIRST_PROFILED}:{PROFILED}"
    if profile or memory or phases:
        here = Path(__file__).resolve().parent
        env["PYTHONPATH"] = f"{here / 'profile_site'}:{here}:{lammps.env['PYTHONPATH']}"
    with GpuMemory() as gpu:
        run = lammps.run(script, ranks, gpus, workdir, door.kokkos, env)
    (workdir / "output.txt").write_text(run.output)  # LAMMPS's timing breakdown
    row = {k: model[k] for k in ("atoms", "dtype", "kernels", "gpus", "round")}
    row |= {"style": style, "peak_gpu_mib": gpu.peak, "workdir": str(workdir)}
    if run.returncode != 0:
        print(f"{style} {dtype} at {natoms} failed: {failure(run)}", flush=True)
        return {**row, "error": failure(run)[-300:]}
    loops = run_ms_per_step(run.output)[-3:]
    ms = statistics.median(loops)
    row |= {"ms_per_step": ms, "repeats_ms": loops}
    if kernels.exists():
        row["profile"] = json.loads(kernels.read_text())
    if phases_file.exists():
        row["phases"] = json.loads(phases_file.read_text())
        print(f"  phases (ms, synchronized): {row['phases']}", flush=True)
    if memory_file.exists():
        row["memory"] = json.loads(memory_file.read_text())
        for m in row["memory"]:
            print(
                f"  step {m['step']} {m['mark']:18s} allocated {m['allocated_gib']:7.2f} GiB, "
                f"peak since the last mark {m['peak_since_last_gib']:7.2f}, reserved "
                f"{m['reserved_gib']:7.2f}",
                flush=True,
            )
    reference = model.get(model_key(mode))
    if reference:
        row["step_over_model"] = ms / reference
    return row


def _rounds_summary(base: dict, styles: list[str], timed: list[dict]) -> list[dict]:
    """Per style: the median ms/step over the rounds and the median of the rounds'
    step / model ratios (each against the bare model of its own round)."""
    summary = []
    for style in styles:
        runs = [r for r in timed if r["style"] == style and "step_over_model" in r]
        if not runs:
            continue
        row = {**base, "style": style, "rounds": len(runs)}
        row["ms_per_step"] = statistics.median(r["ms_per_step"] for r in runs)
        row["step_over_model"] = statistics.median(r["step_over_model"] for r in runs)
        row["step_over_model_rounds"] = [r["step_over_model"] for r in runs]
        summary.append(row)
        print(
            f"{base['atoms']:8d} atoms {style:12s} over {len(runs)} rounds: "
            f"{row['ms_per_step']:8.2f} ms/step, step/model {row['step_over_model']:.2f} "
            f"({', '.join(f'{r:.2f}' for r in row['step_over_model_rounds'])})",
            flush=True,
        )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["prepare", "cueq", "check", "bench"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--lammps", type=Path, help="PREFIX of tools/build_lammps_kokkos.sh")
    parser.add_argument("--gpus", type=int, default=1, help="0: a KOKKOS LAMMPS for the host")
    parser.add_argument("--atoms", type=int, nargs="+", default=[1000, 20000, 100000])
    parser.add_argument("--steps", type=int, default=20, help="bench: timed steps per repeat")
    parser.add_argument(
        "--rounds", type=int, default=1, help="bench: every style again, alternating order"
    )
    parser.add_argument(
        "--models", nargs="+", default=[c.name for c in CASES], help="check: these models only"
    )
    parser.add_argument(
        "--dtypes", nargs="+", default=["float32", "float64"], help="bench: these precisions"
    )
    parser.add_argument(
        "--kernels", choices=KERNELS, default="e3nn", help="bench: MACE's kernels, both sides"
    )
    parser.add_argument("--nve-steps", type=int, default=200, help="check: 0 for none")
    parser.add_argument("--door", choices=DOORS[:2], default="mliap", help="check: the door")
    parser.add_argument(
        "--compile", default="no", help="check: the models compiled in this torch.compile mode"
    )
    parser.add_argument(
        "--styles",
        nargs="+",
        choices=list(STYLES),
        default=["mliap", "mace-torch"],
        help="bench: these styles, side by side",
    )
    parser.add_argument(
        "--model-calls", type=int, default=10, help="bench: bare model calls timed, 0: none"
    )
    parser.add_argument(
        "--profile", action="store_true", help="bench: kernels per step against the bare model"
    )
    parser.add_argument(
        "--memory", action="store_true", help="bench: nvalchemi/kk's GPU memory phase by phase"
    )
    parser.add_argument(
        "--phases", action="store_true", help="bench: each step's host time phase by phase"
    )
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument("--package", default="", help="more -pk kokkos keywords")
    args = parser.parse_args()
    data = args.dir.resolve()
    if args.mode == "prepare":
        prepare(data)
        return 0
    if args.mode == "cueq":
        convert_to_cueq(data)
        return 0
    lammps = Lammps(args.lammps.resolve(), tuple(args.package.split()))
    if args.mode == "check":
        rows = check(
            data, lammps, Door(args.door), args.gpus, args.models, args.nve_steps, args.compile
        )
        print(f"\n{'model':16s} {'run':28s} {'worst quantity':16s} {'relative':>10s}  result")
        for r in rows:
            print(
                f"{r.model:16s} {r.run:28s} {r.worst:16s} {r.relative:10.2e}  "
                f"{'PASS' if r.passed else 'FAIL ' + r.detail}"
            )
        result: list = [asdict(r) for r in rows]
        ok = all(r.passed for r in rows)
    else:
        result = bench(
            data,
            lammps,
            args.atoms,
            args.gpus,
            args.steps,
            args.dtypes,
            args.kernels,
            args.styles,
            args.rounds,
            args.profile,
            args.model_calls,
            args.memory,
            args.phases,
        )
        ok = True
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
