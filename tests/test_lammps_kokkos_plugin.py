"""Front door C in a real LAMMPS: ``pair_style nvalchemi/kk`` (``-sf kk``), the KOKKOS
variant of the plugin, in a LAMMPS built with KOKKOS (``tools/build_lammps_kokkos.sh ...
SERIAL``: Kokkos's Serial space runs the same /kk code as a GPU, on the host) with the plugin
compiled against it (``tools/build_plugin_kokkos.sh``), on 1, 2 and 4 ranks (a rank without
atoms at 4). Found through ``NVALCHEMI_LAMMPS_KOKKOS`` (the PREFIX of both scripts).

Per atom by ID, to 1e-10 relative in float64, against the single-process reference without
LAMMPS and against ``pair_style nvalchemi`` in the same LAMMPS process (energy, per-atom
energy, forces, pressure, per-atom virial stress): Lennard-Jones; message passing (ghost
features exchanged through KOKKOS's pair communication, forward and, in the backward pass,
reverse, on its device and host paths; and the widened shell); MACE; DFT-D3; AIMNet2 with a
net charge (charge equilibration summed over ranks); Ewald and PME (positions, the cell,
charges from KOKKOS's ``q``); pipelines (Lennard-Jones + message passing + Ewald; AIMNet2's
charges into PME); the message-passing model under ``compile yes`` (1 and 2 ranks);
``pair_style mliap unified`` after the plugin has started Python. 200
NVE steps on 2 and 4 ranks equal to 1 rank. Non-finite results and the plugin's input
checks stop the run with the plugin's messages.

Most of a run's cost is starting torch and the model's packages on every rank: the models
that need the same packages run in one LAMMPS process per rank count, one after the other
(``clear`` between, each model's output cut out by its segment line), and so do the ways
ghost features move for one model and rank count.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from _bad_inputs import BAD_INPUTS, BadInput, assert_clear_error, bad_input_script
from _systems import ar_ne_slab, fcc_argon_222, lennard_jones
from lammps_helpers import (
    COMPILED,
    NPROCS,
    assert_all_close,
    assert_matches_reference,
    assert_ranks_own,
    assert_runs_agree,
    atoms_per_rank,
    built_lammps,
    comparison_script,
    neighbor_list_builds,
    print_results,
    read_evaluation,
    run0_evaluation,
    run0_header,
    segment_start,
    segments,
)

from nvalchemi_lammps import Ewald, MessagePassing, Pipeline, Pme, save_model
from nvalchemi_lammps.lammps_run import (
    LammpsRun,
    lammps_command,
    read_dump,
    read_results,
    run_command,
    write_lammps_data,
)
from nvalchemi_lammps.potentials import mace as mace_module
from nvalchemi_lammps.reference import evaluate_reference
from nvalchemi_lammps.structures import element_masses

pytestmark = pytest.mark.lammps

MASSES = [39.948, 20.1797]
#: what every run passes LAMMPS: KOKKOS on, one host thread (Serial)
KOKKOS = ["-k", "on", "t", "1", "-sf", "kk", "-pk", "kokkos", "newton", "on", "neigh", "half"]


@dataclass(frozen=True)
class KokkosLammps:
    """The KOKKOS LAMMPS, the nvalchemi/kk plugin compiled against it, and the environment
    its embedded Python needs."""

    lmp: Path
    plugin: Path
    env: dict[str, str]

    def run(self, script: str, nprocs: int, workdir: Path, env: dict[str, str] | None = None):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "in.lammps").write_text(f"plugin load {self.plugin}\n" + script)
        cmd = lammps_command(nprocs, self.lmp) + KOKKOS
        cmd += ["-in", "in.lammps", "-log", "log.lammps"]
        return run_command(cmd, workdir, timeout=900, env={**self.env, **(env or {})})


@pytest.fixture(scope="module")
def kokkos_lammps() -> KokkosLammps:
    prefix, lmp, env = built_lammps("NVALCHEMI_LAMMPS_KOKKOS")
    build = prefix / "plugin-build"
    assert (build / "CMakeCache.txt").exists(), f"{build} missing: run tools/build_plugin_kokkos.sh"
    # the plugin as the sources are now (incremental: seconds when nothing changed), one
    # build at a time: modules that use this fixture may run in parallel (pytest -n)
    cmake = Path(sys.executable).parent / "cmake"
    with open(build / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run_command(
            [str(cmake) if cmake.exists() else "cmake", "--build", str(build)], build, timeout=1800
        ).check()
    plugin = build / "cpp_bridge" / "nvalchemiplugin.so"
    libdir = next((prefix / "install").glob("lib*/liblammps.so")).parent
    python = _lammps_python(libdir / "liblammps.so", env)
    if python:  # the plugin's interpreter is the one LAMMPS's PYTHON package links
        env["NVALCHEMI_LAMMPS_PYTHON"] = python
    return KokkosLammps(lmp, plugin, env)


def _lammps_python(library: Path, env: dict[str, str]) -> str | None:
    """The executable of the libpython that ``library`` links (a LAMMPS with PYTHON loads
    it first, so the plugin's interpreter runs on it and needs its standard library), or
    ``None`` when it links none."""
    out = subprocess.run(
        ["ldd", str(library)], check=True, capture_output=True, text=True, env={**os.environ, **env}
    ).stdout
    found = re.search(r"libpython(\d+\.\d+)\S*\s+=>\s+(\S+)", out)
    if not found:
        return None
    version, path = found.groups()
    lib = Path(path).resolve().parent
    # <prefix>/lib/libpython3.X.so (a Python's own prefix), or a distribution's multiarch
    # folder under /usr/lib or /lib, whose Python is /usr/bin/python3.X
    for candidate in (lib.parent / "bin" / f"python{version}", Path(f"/usr/bin/python{version}")):
        if candidate.exists():
            return str(candidate)
    return None


@pytest.fixture(scope="module")
def lj_model(tmp_path_factory) -> tuple[object, Path]:
    potential = lennard_jones(fcc_argon_222(), cutoff=6.0)
    return potential, save_model(potential, tmp_path_factory.mktemp("kk") / "lj.pt")


@pytest.fixture(scope="module")
def mp_model(tmp_path_factory) -> tuple[object, Path]:
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, features=12, seed=7)
    return potential, save_model(potential, tmp_path_factory.mktemp("kk") / "mp.pt")


def _slab(workdir: Path):
    """The Ar/Ne slab (a rank without atoms at 4 ranks) as a data file, and its arrays."""
    workdir.mkdir(parents=True, exist_ok=True)
    positions, cell, species = ar_ne_slab(4)
    data = write_lammps_data(workdir / "slab.data", positions, cell, species + 1, MASSES)
    return data, positions, cell, species


def _vacuum_above(positions: np.ndarray, cell: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The box doubled along z, the atoms 1 Angstrom up: split in 4 along z, the top rank
    owns nothing."""
    cell = cell.copy()
    cell[2, 2] *= 2.0
    return positions + [0.0, 0.0, 1.0], cell


@dataclass(frozen=True)
class System:
    """Atoms as the tests hand them to LAMMPS: model species (type - 1), masses by type,
    per-atom charges (``atom_style charge``) or ``None``."""

    positions: np.ndarray
    cell: np.ndarray
    species: np.ndarray
    masses: list[float]
    charges: np.ndarray | None = None


def _system(name: str) -> System:
    """``slab``: the Ar/Ne slab; ``molecules``: small H/C/N/O molecules (AIMNet2);
    ``copper_oxide``: Cu, O, C and H (UMA); ``salt``: rock-salt NaCl with charges;
    ``argon_krypton``: the pipeline tests' Ar/Kr box. Each with vacuum above it: at 4 ranks
    (``processors 1 1 4``) a rank owns no atom."""
    if name == "slab":
        return System(*ar_ne_slab(4), MASSES)
    if name in ("molecules", "copper_oxide"):
        if name == "molecules":
            from _aimnet2_models import molecules_vacuum as atoms
        else:
            from _uma_models import copper_oxide_slab as atoms

        box = atoms()
        masses = element_masses(list(box.elements), True)
        return System(box.positions, box.cell, box.species, masses)
    if name == "salt":
        from _ionic_systems import rock_salt

        positions, cell, species, charges = rock_salt(2, displacement=0.2, seed=5)
        return System(*_vacuum_above(positions, cell), species, [22.98977, 35.453], charges)
    from _pipeline_terms import system

    positions, cell, species = system(cells=2, seed=5)
    return System(*_vacuum_above(positions, cell), species, [39.948, 83.798])


@dataclass(frozen=True)
class Model:
    """A model as the comparison runs it.

    :param fixture: the fixture that gives ``(potential, model file)``
    :param system: its atoms (:func:`_system`)
    :param elements: the element of each LAMMPS type (``pair_coeff * *``)
    :param keywords: more ``pair_style`` keywords
    :param total_charge: the net charge the keywords give (for the reference)
    :param stress: compare per-atom virial stress with the reference (not for terms that
        are not pairwise: the reference's per-atom virial holds the pairwise part only)
    :param nprocs: rank counts it runs on
    :param versus_plugin: also against ``pair_style nvalchemi`` in the same LAMMPS
    :param setup: input before the script (KOKKOS's package options)
    :param process: the models of one ``process`` and rank count run in one LAMMPS
        process, one after the other (``clear`` between): torch and the model's packages
        start once per rank for all of them (:func:`shared_runs`)
    """

    fixture: str
    system: str = "slab"
    elements: str = "Ar Ne"
    keywords: str = ""
    total_charge: float = 0.0
    stress: bool = True
    nprocs: tuple[int, ...] = (1, 4)
    versus_plugin: bool = True
    setup: str = ""
    process: str = "torch"


#: Every model runs on 1 and 4 ranks (at 4 ranks two of them own no atoms): 2 ranks would
#: repeat the 4 ranks' exchanges with fewer neighbors and no empty rank. The door's 2-rank
#: runs: mp-exchange (make check's), mp-exchange-hostcomm and mp-compile.


#: KOKKOS's host path for pair communication (it takes it when told to or, on a GPU, when
#: MPI is not GPU-aware on several ranks: docs/gpus.md), instead of its device path
#: (pack/unpack kernels on the execution space's memory: Serial here, a GPU's memory there)
HOST_COMM = "package kokkos newton on neigh half comm/pair/forward host comm/pair/reverse host\n"

MODELS = {
    "lj": Model("lj_model"),
    "mp-exchange": Model("mp_model", keywords="strategy exchange", nprocs=tuple(NPROCS)),
    # on several ranks KOKKOS's host path for pair communication makes the exchanges go by
    # the exchange plan (remote atoms' rows once each, through the host); on one rank the
    # plan's gather is mp-exchange's
    "mp-exchange-hostcomm": Model(
        "mp_model", keywords="strategy exchange", setup=HOST_COMM, nprocs=(2, 4)
    ),
    "mace-exchange-hostcomm": Model(
        "mace_model",
        elements="Ar Kr",
        keywords="strategy exchange",
        setup=HOST_COMM,
        nprocs=(4,),
        process="mace",
    ),
    # no exchange: 2 ranks would repeat the 4 ranks' thick shell
    "mp-shell": Model("mp_model", keywords="strategy shell", nprocs=(1, 4)),
    "mace-exchange": Model(
        "mace_model", elements="Ar Kr", keywords="strategy exchange", process="mace"
    ),
    "d3-exchange": Model("d3_model", elements="C H", keywords="strategy exchange"),
    # charge equilibration: the net charge of every rank's atoms summed over ranks
    "aimnet2-exchange": Model(
        "aimnet2_model",
        "molecules",
        "H C N O",
        "strategy exchange charge -1",
        total_charge=-1.0,
        process="aimnet2",
    ),
    # positions, charges from LAMMPS's KOKKOS q, the cell: forces on owned and ghost rows
    # and a virial beyond f.r
    "ewald": Model("ewald_model", "salt", "Na Cl", stress=False),
    "pme": Model("pme_model", "salt", "Na Cl", stress=False),
    # Lennard-Jones + message passing + Ewald with charges by element
    "pipeline-exchange": Model(
        "pipeline_model", "argon_krypton", "Ar Kr", "strategy exchange", stress=False
    ),
    # charges predicted on each rank's atoms (equilibrated over ranks), read by PME; on 4
    # ranks only (its terms alone: aimnet2-exchange and pme at 1 and 4 ranks; the pipeline
    # at 1, 2 and 4 through pair_style nvalchemi, tests/test_lammps_pipeline_mlips.py)
    "pipeline-aimnet2-pme": Model(
        "aimnet2_pme_model",
        "molecules",
        "H C N O",
        "strategy exchange charge 1",
        total_charge=1.0,
        stress=False,
        nprocs=(4,),
        process="aimnet2",
    ),
    # UMA (fairchem-core: its own environment, pytest -m uma there), charged: its
    # embeddings read the net charge of all ranks' atoms
    "uma-exchange": Model(
        "uma_model",
        "copper_oxide",
        "H C O Cu",
        "strategy exchange charge -1",
        total_charge=-1.0,
        process="uma",
    ),
    # compiled on CPU takes a while: one small case, on 2 ranks, and not twice (kk and
    # plain); compiled on one rank: tests/test_lammps_compile.py and test_lammps_mliap.py
    "mp-compile": Model(
        "mp_model",
        keywords="strategy exchange compile yes",
        nprocs=(2,),
        versus_plugin=False,
        process="compile",
    ),
}
try:  # at collection: importing mace-torch warns, which a test would turn into an error
    mace_module._mace()
    HAVE_MACE = True
except ImportError:  # pragma: no cover - mace-torch is an optional dependency
    HAVE_MACE = False


@pytest.fixture(scope="module")
def mace_model(tmp_path_factory) -> tuple[object, Path]:
    if not HAVE_MACE:
        pytest.skip("mace-torch is not installed")
    from _mace_models import VARIANTS, random_mace

    potential = mace_module.Mace.from_model(random_mace(**VARIANTS["scale_shift"]))
    return potential, save_model(potential, tmp_path_factory.mktemp("kk") / "mace.pt")


@pytest.fixture(scope="module")
def d3_model(tmp_path_factory) -> tuple[object, Path]:
    """DFT-D3(BJ) on C and H (coordination numbers: two layers, exchanged), the slab's
    two types as C and H."""
    from nvalchemi_lammps.potentials.dftd3 import DFTD3

    potential = DFTD3(["C", "H"], 7.0, 5.0, functional="pbe")
    return potential, save_model(potential, tmp_path_factory.mktemp("kk") / "d3.pt")


@pytest.fixture(scope="module")
def aimnet2_model(tmp_path_factory) -> tuple[object, Path]:
    """AIMNet2 in float64, random weights that equilibrate charges as a trained model."""
    pytest.importorskip("aimnet")
    from _aimnet2_models import random_aimnet2

    potential = random_aimnet2(seed=0, dtype="float64")
    return potential, save_model(potential, tmp_path_factory.mktemp("kk") / "aimnet2.pt")


@pytest.fixture(scope="module")
def uma_model(tmp_path_factory) -> tuple[object, Path]:
    """A random UMA in float64 (fairchem-core's classes)."""
    pytest.importorskip("fairchem.core")
    from _uma_models import random_uma

    potential = random_uma(seed=0, dtype="float64")
    return potential, save_model(potential, tmp_path_factory.mktemp("kk") / "uma.pt")


@pytest.fixture(scope="module")
def ewald_model(tmp_path_factory) -> tuple[object, Path]:
    potential = Ewald(["Na", "Cl"], cutoff=8.0, accuracy=1e-6)
    return potential, save_model(potential, tmp_path_factory.mktemp("kk") / "ewald.pt")


@pytest.fixture(scope="module")
def pme_model(tmp_path_factory) -> tuple[object, Path]:
    potential = Pme(["Na", "Cl"], cutoff=8.0, accuracy=1e-5)
    return potential, save_model(potential, tmp_path_factory.mktemp("kk") / "pme.pt")


@pytest.fixture(scope="module")
def pipeline_model(tmp_path_factory) -> tuple[object, Path]:
    from _pipeline_terms import terms

    potential = Pipeline(terms())
    return potential, save_model(potential, tmp_path_factory.mktemp("kk") / "pipeline.pt")


@pytest.fixture(scope="module")
def aimnet2_pme_model(aimnet2_model, tmp_path_factory) -> tuple[object, Path]:
    """AIMNet2's predicted charges into PME (with the background of a net charge), as in
    tests/test_lammps_pipeline_mlips.py."""
    elements = ["H", "C", "N", "O"]
    pme = Pme(elements, cutoff=6.0, alpha=0.5, mesh=12, order=5, background=True)
    potential = Pipeline([aimnet2_model[0], pme], charges_from=[None, 0])
    return potential, save_model(potential, tmp_path_factory.mktemp("kk") / "aimnet2_pme.pt")


CASES = [
    pytest.param(
        name,
        nprocs,
        id=f"{name}-np{nprocs}",
        marks=[pytest.mark.uma] if name.startswith("uma") else [],
    )
    for name, model in MODELS.items()
    for nprocs in model.nprocs
]


def _data_file(workdir: Path, name: str, system: System) -> Path:
    return write_lammps_data(
        workdir / f"{name}.data",
        system.positions,
        system.cell,
        system.species + 1,
        system.masses,
        system.charges,
    )


def _case_script(name: str, model: Model, path: Path, data: Path, nprocs: int) -> str:
    """One model's evaluations: ``nvalchemi/kk`` (dump and results ``NAME-kk``) and, with
    ``versus_plugin``, ``pair_style nvalchemi`` next (``NAME-plain``)."""
    style = f"pair_style nvalchemi {path} {model.keywords}\npair_coeff * * {model.elements}\n"
    script = model.setup + run0_header(str(data), f"processors 1 1 {nprocs}")
    if _system(model.system).charges is not None:
        script = script.replace("atom_style atomic", "atom_style charge")
    script += style + run0_evaluation(f"{name}-kk")
    if model.versus_plugin:  # the same LAMMPS, KOKKOS atoms and comm, no suffix
        script += "suffix off\n" + style + run0_evaluation(f"{name}-plain")
    return script


@dataclass(frozen=True)
class SharedRun:
    """One LAMMPS process that evaluated several models (:func:`shared_runs`): its run,
    the output of each model's segment, the models whose fixture skipped (with why)."""

    run: LammpsRun
    outputs: dict[str, str]
    skipped: dict[str, str]

    def output(self, name: str) -> str:
        """The output of ``name``'s segment: complete where the next segment started, else
        only where the whole process succeeded (it fails with the failing model's error)."""
        names = list(self.outputs)
        if name not in names or name == names[-1]:
            self.run.check()
        assert name in self.outputs, f"no segment {name}: {self.run.output[-3000:]}"
        return self.outputs[name]


def _mliap_after_plugin_script(path: Path, data: Path, nprocs: int) -> str:
    """``pair_style nvalchemi/kk`` (``mliap-after-plugin-kk``), then ``pair_style mliap
    unified`` with the same model file (``mliap-after-plugin-mliap``)."""
    script = run0_header(str(data), f"processors 1 1 {nprocs}")
    script += f"pair_style nvalchemi {path}\npair_coeff * * Ar Ne\n"
    script += run0_evaluation("mliap-after-plugin-kk")
    script += f"pair_style mliap unified {path} 0\npair_coeff * * Ar Ne\n"
    return script + run0_evaluation("mliap-after-plugin-mliap")


def _nve_script(data: str, model: Path, processors: str, steps: int, name: str) -> str:
    """``steps`` NVE steps from 300 K, then the dump ``NAME.dump`` (positions, velocities,
    forces) and the energies printed with the tag ``NAME`` in capitals."""
    return (
        "units metal\natom_style atomic\natom_modify map array\n"
        f"{processors}\nread_data {data}\n"
        f"pair_style nvalchemi {model}\npair_coeff * * Ar Ne\n"
        "velocity all create 300.0 4928459 loop geom\n"
        "neighbor 1.0 bin\nneigh_modify every 1 delay 0 check yes\n"
        "fix 1 all nve\ntimestep 0.002\nthermo 50\n"
        f"run {steps}\n"
        f"dump d all custom 1 {name}.dump id x y z vx vy vz fx fy fz\n"
        'dump_modify d sort id format float "%.17g"\n'
        "run 0\n" + print_results(name.upper(), {"pe": "pe", "etotal": "etotal"})
    )


def _nve200_script(path: Path, data: Path, nprocs: int) -> str:
    return _nve_script(str(data), path, f"processors 1 1 {nprocs}", 200, "nve200")


#: The shared processes' segments besides :data:`MODELS`' (:func:`shared_runs`), by name:
#: (process, rank counts, model fixture, system, script of (model file, data file, ranks))
OTHER_SEGMENTS = {
    "mliap-after-plugin": ("torch", (1, 4), "mp_model", "slab", _mliap_after_plugin_script),
    # 2 ranks in a process of its own: make check's 2-rank process stays two evaluations
    "nve200": ("torch", (1, 4), "mp_model", "slab", _nve200_script),
}


@pytest.fixture(scope="module")
def shared_runs(kokkos_lammps, request, tmp_path_factory):
    """``(process, nprocs) -> SharedRun``, each run once: every model of :data:`MODELS`
    (and segment of :data:`OTHER_SEGMENTS`) with that ``process`` and rank count in one
    LAMMPS process, one after the other with ``clear`` between (after ``suffix on``:
    ``clear`` makes the run style with the suffix as it is then). The models with KOKKOS's
    host path for pair communication go last: a ``package kokkos`` setting outlives
    ``clear`` too."""
    done: dict[tuple[str, int], SharedRun] = {}

    def get(process: str, nprocs: int) -> SharedRun:
        if (process, nprocs) in done:
            return done[(process, nprocs)]
        workdir = tmp_path_factory.mktemp(f"kk-{process}-np{nprocs}")
        # (name, host path, model fixture, system, script of model file, data file, ranks)
        entries = [
            (n, bool(m.setup), m.fixture, m.system, partial(_case_script, n, m))
            for n, m in MODELS.items()
            if m.process == process and nprocs in m.nprocs
        ]
        entries += [
            (n, False, fixture, system, script_of)
            for n, (p, ranks, fixture, system, script_of) in OTHER_SEGMENTS.items()
            if p == process and nprocs in ranks
        ]
        entries.sort(key=lambda entry: entry[1])
        script, skipped = "", {}
        for name, _, fixture, system, script_of in entries:
            try:
                _, path = request.getfixturevalue(fixture)
            except pytest.skip.Exception as skip:
                skipped[name] = str(skip)
                continue
            data = _data_file(workdir, name, _system(system))
            script += "suffix on\nclear\n" if script else ""
            script += segment_start(name) + script_of(path, data, nprocs)
        run = kokkos_lammps.run(script, nprocs, workdir)
        done[(process, nprocs)] = SharedRun(run, segments(run.output), skipped)
        return done[(process, nprocs)]

    return get


@pytest.mark.parametrize(("name", "nprocs"), CASES)
def test_kokkos_equals_reference_and_plugin(shared_runs, request, name, nprocs):
    """Energy, per-atom energy, forces, pressure and per-atom virial stress by atom ID:
    ``nvalchemi/kk`` against the single-process reference, and against ``pair_style
    nvalchemi`` (no suffix) run next in the same LAMMPS process. The models of one
    ``process`` run in one LAMMPS process per rank count (:func:`shared_runs`): one start of
    torch and the model's packages for all of them."""
    model = MODELS[name]
    shared = shared_runs(model.process, nprocs)
    if name in shared.skipped:
        pytest.skip(shared.skipped[name])
    output = shared.output(name)
    potential, _ = request.getfixturevalue(model.fixture)
    system = _system(model.system)
    ref = evaluate_reference(
        potential,
        system.positions,
        system.cell,
        (True, True, True),
        system.species,
        charges=system.charges,
        total_charge=model.total_charge,
    )
    assert "pair nvalchemi/kk, perpetual" in output, output[-3000:]
    if "compile" in model.keywords:
        assert f"torch.compile (default): {potential.name}\n" in output, output[-3000:]
        assert COMPILED.search(output), "the pair style did not report its compilations"
    if nprocs == 4:
        owned = atoms_per_rank(output, "Nlocal")
        assert owned and all(fewest == 0 for fewest, _ in owned), f"no rank without atoms: {owned}"
    ids = np.arange(1, len(system.species) + 1)
    workdir = shared.run.workdir
    kk = read_evaluation(workdir, output, f"{name}-kk", ids)
    label = f"kokkos/{name}/np{nprocs}"
    assert_matches_reference(label, *kk, ref, system.cell, stress=model.stress)
    if model.versus_plugin:
        assert "pair nvalchemi, perpetual" in output, output[-3000:]
        plain = read_evaluation(workdir, output, f"{name}-plain", ids)
        label = f"kokkos-vs-plugin/{name}/np{nprocs}"
        assert_runs_agree(label, kk, plain, tol=1e-10, stress=True)


# 2 ranks: mliap unified's own tests (tests/test_lammps_mliap.py)
@pytest.mark.parametrize("nprocs", [1, 4])
def test_mliap_unified_after_the_plugin_started_python(shared_runs, mp_model, nprocs):
    """``pair_style nvalchemi/kk`` first starts Python; ``pair_style mliap unified`` with the
    same model file next in the same input still imports ML-IAP's coupling module (which
    LAMMPS registers only when it starts Python itself) and gives the same numbers, both
    equal to the single-process reference (a rank without atoms at 4 ranks). In the shared
    process of the models without extra packages (:func:`shared_runs`), after them."""
    potential, _ = mp_model
    name = "mliap-after-plugin"
    shared = shared_runs(OTHER_SEGMENTS[name][0], nprocs)
    output = shared.output(name)
    system = _system("slab")
    ref = evaluate_reference(potential, system.positions, system.cell, (True,) * 3, system.species)
    assert "pair nvalchemi/kk, perpetual" in output, output[-3000:]
    assert "pair mliap/kk, perpetual" in output, output[-3000:]
    if nprocs == 4:
        owned = atoms_per_rank(output, "Nlocal")
        assert owned and all(fewest == 0 for fewest, _ in owned), f"no rank without atoms: {owned}"
    ids = np.arange(1, len(system.species) + 1)
    kk = read_evaluation(shared.run.workdir, output, f"{name}-kk", ids)
    mliap = read_evaluation(shared.run.workdir, output, f"{name}-mliap", ids)
    assert_matches_reference(f"kokkos/mp/np{nprocs}", *kk, ref, system.cell)
    assert_matches_reference(f"mliap-after-kokkos/mp/np{nprocs}", *mliap, ref, system.cell)


def test_md_equal_across_rank_counts(kokkos_lammps, shared_runs, mp_model, tmp_path):
    """200 NVE steps of the message-passing model (atoms migrate, lists are rebuilt, ghost
    features exchanged): 2 and 4 ranks against 1 rank, positions, velocities and forces by
    atom ID, and the total energy. On 1 and 4 ranks in the shared processes
    (:func:`shared_runs`), after the models; on 2 ranks in a process of its own."""
    process, shared_ranks = OTHER_SEGMENTS["nve200"][:2]
    runs = {}
    for nprocs in (1, 2, 4):
        if nprocs in shared_ranks:
            shared = shared_runs(process, nprocs)
            work, output = shared.run.workdir, shared.output("nve200")
        else:
            work = tmp_path / f"np{nprocs}"
            data, *_ = _slab(work)
            script = _nve200_script(mp_model[1], data, nprocs)
            output = kokkos_lammps.run(script, nprocs, work).check().output
        assert neighbor_list_builds(output)[0] > 0, "the lists were never rebuilt"
        runs[nprocs] = read_dump(work / "nve200.dump"), read_results(output, "NVE200")
    (one, one_results) = runs[1]
    for nprocs in (2, 4):
        atoms, results = runs[nprocs]
        np.testing.assert_array_equal(atoms["id"], one["id"])
        assert_all_close(
            f"kokkos-nve200/mp/np{nprocs}-vs-np1",
            {
                **{
                    q: (np.stack([atoms[c] for c in cols], 1), np.stack([one[c] for c in cols], 1))
                    for q, cols in {
                        "positions": ["x", "y", "z"],
                        "velocities": ["vx", "vy", "vz"],
                        "forces": ["fx", "fy", "fz"],
                    }.items()
                },
                "total_energy": (np.array([results["etotal"]]), np.array([one_results["etotal"]])),
            },
            tol=1e-10,
        )


GATHERED = "pair_style nvalchemi/kk: ghost features gathered from the atoms they image"
BY_PLAN = "pair_style nvalchemi/kk: ghost features by the exchange plan"
THROUGH_COMM = "pair_style nvalchemi/kk: ghost features through KOKKOS's pair communication"
#: (NVALCHEMI_LAMMPS_EXCHANGE, ranks, KOKKOS's host path for pair communication, the way
#: the log names): the exchange plan on one rank (a gather), on 2 ranks where KOKKOS would
#: stage pair communication through the host, and KOKKOS's own communication otherwise
EXCHANGE_PATHS = [
    ("gather", 1, False, GATHERED),
    ("comm", 1, False, THROUGH_COMM),
    ("gather", 2, False, THROUGH_COMM),
    ("gather", 2, True, BY_PLAN),
    ("comm", 2, True, THROUGH_COMM),
]


@pytest.mark.parametrize("model", ["mp_model", "mace_model"])
def test_exchange_paths_agree(kokkos_lammps, request, model, tmp_path):
    """Every way ghost features move gives the same energies, forces and virials by atom
    ID: the exchange plan (a gather by owned row on one rank; on 2 ranks under KOKKOS's
    host path, the remote atoms' rows once each through the host) and KOKKOS's pair
    communication (``NVALCHEMI_LAMMPS_EXCHANGE=comm``, or 2 ranks on its device path), for a
    model exchanging through the contract (message passing) and through mace-torch's
    ``LAMMPS_MP`` (MACE). The paths of one rank count run in one LAMMPS process, one after
    the other (``clear`` between, the variable set by ``shell putenv`` before each: the pair
    style reads it at its ``init_style``)."""
    _, path = request.getfixturevalue(model)
    data, _, _, species = _slab(tmp_path)
    elements = "Ar Kr" if model == "mace_model" else "Ar Ne"
    style = f"pair_style nvalchemi {path} strategy exchange\npair_coeff * * {elements}\n"
    ids = np.arange(1, len(species) + 1)
    runs = []
    for nprocs in (1, 2):
        # KOKKOS's host path last: a package kokkos setting outlives clear
        paths = sorted((p for p in EXCHANGE_PATHS if p[1] == nprocs), key=lambda p: p[2])
        # on 2 ranks each owns atoms: ghosts of remote atoms, and images of its own
        processors = "processors 2 1 1" if nprocs == 2 else ""
        work = tmp_path / f"np{nprocs}"
        script = ""
        for mode, _, host, _ in paths:
            name = f"{mode}-np{nprocs}-{'host' if host else 'device'}"
            script += "clear\n" if script else ""
            script += segment_start(name) + f"shell putenv NVALCHEMI_LAMMPS_EXCHANGE={mode}\n"
            script += (HOST_COMM if host else "") + run0_header(str(data), processors)
            script += style + run0_evaluation(name)
        run = kokkos_lammps.run(script, nprocs, work).check()
        outputs = segments(run.output)
        for mode, _, host, log in paths:
            name = f"{mode}-np{nprocs}-{'host' if host else 'device'}"
            assert log in outputs[name], outputs[name][-3000:]
            assert_ranks_own(atoms_per_rank(outputs[name], "Nlocal"), nprocs)
            runs.append((name, read_evaluation(work, outputs[name], name, ids)))
    assert len(runs) == len(EXCHANGE_PATHS)
    (first, one), *others = runs
    for name, other in others:
        label = f"kokkos-exchange-paths/{model}/{first}-vs-{name}"
        assert_runs_agree(label, one, other, tol=1e-10, stress=True)


@pytest.mark.parametrize("nprocs", [1, 2])
def test_unknown_exchange_mode_stops_every_rank(kokkos_lammps, mp_model, nprocs, tmp_path):
    data, *_ = _slab(tmp_path)
    script = run0_header(str(data), f"processors 1 1 {nprocs}")
    script += f"pair_style nvalchemi {mp_model[1]}\npair_coeff * * Ar Ne\n" + run0_evaluation("kk")
    run = kokkos_lammps.run(script, nprocs, tmp_path, {"NVALCHEMI_LAMMPS_EXCHANGE": "host"})
    case = BadInput(
        "exchange_mode", ("NVALCHEMI_LAMMPS_EXCHANGE must be gather or comm, not 'host'",)
    )
    assert_clear_error(case, run)


@pytest.mark.parametrize("nprocs", [1, 2])
def test_null_type_of_a_hybrid(kokkos_lammps, lj_model, nprocs, tmp_path):
    """``pair_style hybrid`` (``hybrid/kk``) with the model on argon only (neon ``NULL``,
    ``lj/cut`` for the pairs with neon): KOKKOS hands ``nvalchemi/kk`` a skip list of its
    argon atoms on the device, from which its kernels take the pairs. Equal to ``pair_style
    nvalchemi`` (no suffix) in the same process, per atom by ID."""
    data, _, _, species = _slab(tmp_path)
    style = textwrap.dedent(
        f"""\
        pair_style HYBRID nvalchemi {lj_model[1]} lj/cut 6.0
        pair_coeff * * nvalchemi Ar NULL
        pair_coeff 2 2 lj/cut 0.0031 2.74
        pair_coeff 1 2 lj/cut 0.0062 3.07
        """
    )
    script = run0_header(str(data), f"processors 1 1 {nprocs}")
    script += style.replace("HYBRID", "hybrid") + run0_evaluation("kk")
    # KOKKOS takes hybrid/kk only; without the suffix its sub-styles are the host ones
    script += "suffix off\n" + style.replace("HYBRID", "hybrid/kk") + run0_evaluation("plain")
    run = kokkos_lammps.run(script, nprocs, tmp_path).check()
    # the KOKKOS sub-style asks for a list on the device, the host one (no suffix) does not
    device_lists = re.findall(r"pair nvalchemi, perpetual.*\n.*kokkos_device", run.output)
    assert len(device_lists) == 1, run.output[-3000:]
    ids = np.arange(1, len(species) + 1)
    kk = read_evaluation(tmp_path, run.output, "kk", ids)
    plain = read_evaluation(tmp_path, run.output, "plain", ids)
    assert_runs_agree(f"kokkos-hybrid-null/np{nprocs}", kk, plain, tol=1e-10, stress=True)


@pytest.mark.parametrize("nprocs", [1, 2])
def test_non_finite_results_stop_every_rank(kokkos_lammps, lj_model, nprocs, tmp_path):
    """Two atoms on the same spot: the model's energy is not finite; the run stops on every
    rank, naming the atoms by ID (the report all doors share)."""
    positions, cell, species = ar_ne_slab(4)
    positions[1] = positions[0]
    data = write_lammps_data(tmp_path / "slab.data", positions, cell, species + 1, MASSES)
    script = comparison_script(
        str(data), f"nvalchemi {lj_model[1]}", "Ar Ne", f"processors 1 1 {nprocs}"
    )
    run = kokkos_lammps.run(script, nprocs, tmp_path / "kk")
    assert run.returncode != 0
    assert "Pair style nvalchemi/kk failed at step 0" in run.output, run.output[-3000:]
    assert "atoms 1 and 2 are on the same spot" in run.output, run.output[-3000:]


#: (fix halt or nothing, where the run stops, what it says): a step LAMMPS reads nothing of
#: is read at the next step, or at the end of the run when no step comes after it (a halt
#: on free disk space invokes no compute, so step 1 stays a step read later)
NAN_CASES = {
    "next-step": (
        "",
        "failed at step 2",
        "non-finite energies or forces at step 1 (read at the next step",
    ),
    "halted": (
        "fix stop all halt 1 diskfree > 0.0 error continue",
        "failed at the end of the run (step 1)",
        "non-finite energies or forces at step 1 (read at the end of the run",
    ),
}


@pytest.mark.parametrize("nprocs", [1, 2])
@pytest.mark.parametrize("case", list(NAN_CASES))
def test_non_finite_position_stops_every_rank(kokkos_lammps, lj_model, case, nprocs, tmp_path):
    """Atom 1 given a NaN velocity: from step 1 its position is NaN and it drops out of every
    pair within the cutoff. Before: finite energies and exit 0. LAMMPS reads nothing of
    step 1 (thermo at steps 0 and 3 only): its finiteness is read at step 2, which stops
    there, naming step 1 and the atom; or, when ``fix halt`` ends the run after step 1, at
    the end of the run, which stops LAMMPS before the input goes on."""
    halt, where, what = NAN_CASES[case]
    positions, cell, species = ar_ne_slab(4)
    data = write_lammps_data(tmp_path / "slab.data", positions, cell, species + 1, MASSES)
    script = run0_header(str(data), f"processors 1 1 {nprocs}") + textwrap.dedent(
        f"""\
        pair_style nvalchemi {lj_model[1]}
        pair_coeff * * Ar Ne
        variable nan atom 1e300*1e300-1e300*1e300
        set atom 1 vx v_nan
        fix nve all nve
        {halt}
        run 3
        print "after-the-run"
        """
    )
    run = kokkos_lammps.run(script, nprocs, tmp_path / "kk")
    assert run.returncode != 0, run.output[-3000:]
    assert f"Pair style nvalchemi/kk {where}" in run.output, run.output[-3000:]
    assert what in run.output, run.output[-3000:]
    if case == "next-step":
        assert "atom 1 with a non-finite position at step 2" in run.output, run.output[-3000:]
    assert "\nafter-the-run" not in run.output


#: the plugin's checks, through nvalchemi/kk (tests/test_lammps_errors.py runs them all
#: through pair_style nvalchemi)
ERRORS = [
    "unknown_keyword",
    "unknown_element",
    "wrong_number_of_elements",
    "units_mismatch",
    "task_for_lj",
    "compile_mode_unknown",
    "newton_off",
    "pair_modify_mix",
]


def _device_case() -> BadInput:
    """A model on CUDA while LAMMPS's KOKKOS arrays are on the host (Serial): where torch
    sees a GPU the pair style's check stops the step; where it sees none, the plugin's."""
    if torch.cuda.is_available():
        message = "LAMMPS's KOKKOS arrays are on cpu but the model is on cuda:0"
    else:
        message = "device cuda requested but torch"
    return BadInput("device_mismatch", (message,), style_args="device cuda")


#: on 2 ranks: one check of the input, and the model's device
ERRORS_TWO_RANKS = ["unknown_element", "device_mismatch"]
ERROR_CASES = [
    pytest.param(case, nprocs, id=f"{case.id}-np{nprocs}")
    for case in [c for c in BAD_INPUTS if c.id in ERRORS] + [_device_case()]
    for nprocs in ((1, 2) if case.id in ERRORS_TWO_RANKS else (1,))
]


@pytest.mark.parametrize(("case", "nprocs"), ERROR_CASES)
def test_plugin_errors_hold_for_kokkos(kokkos_lammps, case, nprocs, argon_data, models, tmp_path):
    """nvalchemi/kk is the plugin's pair style: bad input stops the run with the plugin's
    message (the inputs of tests/test_lammps_errors.py, under ``-sf kk``)."""
    script = bad_input_script(case, models[case.model], argon_data)
    assert_clear_error(case, kokkos_lammps.run(script, nprocs, tmp_path / "kk"))
