"""Front door C in a real LAMMPS: ``pair_style nvalchemi/kk`` (``-sf kk``), the KOKKOS
variant of the plugin, in a LAMMPS built with KOKKOS (``tools/build_lammps_kokkos.sh ...
SERIAL``: Kokkos's Serial space runs the same /kk code as a GPU, on the host) with the plugin
compiled against it (``tools/build_plugin_kokkos.sh``), on 1, 2 and 4 ranks (a rank without
atoms at 4). Found through ``NVALCHEMI_LAMMPS_KOKKOS`` (the PREFIX of both scripts).

Per atom by ID, to 1e-10 relative in float64: a Lennard-Jones model and a message-passing
model (ghost features exchanged through KOKKOS's pair communication, forward and, in the
backward pass, reverse; and the widened shell) against the single-process reference
without LAMMPS and against ``pair_style nvalchemi`` in the same LAMMPS; 200 NVE steps on
2 and 4 ranks equal to 1 rank.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from _systems import ar_ne_slab, fcc_argon_222, lennard_jones
from lammps_helpers import (
    NPROCS,
    assert_all_close,
    assert_matches_reference,
    assert_runs_agree,
    atoms_per_rank,
    built_lammps,
    comparison_script,
    neighbor_list_builds,
    print_results,
)

from nvalchemi_lammps import MessagePassing, save_model
from nvalchemi_lammps.lammps_run import (
    lammps_command,
    read_dump,
    read_results,
    run_command,
    write_lammps_data,
)
from nvalchemi_lammps.potentials import mace as mace_module
from nvalchemi_lammps.reference import evaluate_reference

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

    def run(self, script: str, nprocs: int, workdir: Path):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "in.lammps").write_text(f"plugin load {self.plugin}\n" + script)
        cmd = lammps_command(nprocs, self.lmp) + KOKKOS
        cmd += ["-in", "in.lammps", "-log", "log.lammps"]
        return run_command(cmd, workdir, timeout=900, env=self.env)


@pytest.fixture(scope="module")
def kokkos_lammps() -> KokkosLammps:
    prefix, lmp, env = built_lammps("NVALCHEMI_LAMMPS_KOKKOS")
    build = prefix / "plugin-build"
    assert (build / "CMakeCache.txt").exists(), f"{build} missing: run tools/build_plugin_kokkos.sh"
    # the plugin as the sources are now (incremental: seconds when nothing changed)
    cmake = Path(sys.executable).parent / "cmake"
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


#: the models, and for the exchange both of KOKKOS's paths for pair communication: its
#: device path (pack/unpack kernels on the execution space's memory: Serial here, a GPU's
#: memory there) and the host path it takes when told to (or, on a GPU, when MPI is not
#: GPU-aware on several ranks: docs/kokkos.md)
MODELS = ["lj", "mp-exchange", "mp-exchange-hostcomm", "mp-shell", "mace-exchange", "d3-exchange"]
HOST_COMM = "package kokkos newton on neigh half comm/pair/forward host comm/pair/reverse host\n"


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


ELEMENTS = {"mace": "Ar Kr", "d3": "C H"}


def _style(name: str, request) -> tuple[object, str, str]:
    """The potential, the pair_style arguments and the element of each LAMMPS type."""
    if name == "lj":
        potential, path = request.getfixturevalue("lj_model")
        return potential, f"nvalchemi {path}", "Ar Ne"
    model, strategy = name.split("-")[:2]
    potential, path = request.getfixturevalue(f"{model}_model")
    return potential, f"nvalchemi {path} strategy {strategy}", ELEMENTS.get(model, "Ar Ne")


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
@pytest.mark.parametrize("name", MODELS)
def test_kokkos_equals_reference_and_plugin(kokkos_lammps, request, name, nprocs, tmp_path):
    """Energy, per-atom energy, forces, pressure and per-atom virial stress by atom ID:
    ``nvalchemi/kk`` against the single-process reference, and against ``pair_style
    nvalchemi`` (no suffix) in the same LAMMPS."""
    potential, style, elements = _style(name, request)
    data, positions, cell, species = _slab(tmp_path)
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    script = comparison_script(str(data), style, elements, f"processors 1 1 {nprocs}")
    if name.endswith("hostcomm"):
        script = HOST_COMM + script
    run = kokkos_lammps.run(script, nprocs, tmp_path / "kk").check()
    assert "pair nvalchemi/kk, perpetual" in run.output, run.output[-3000:]
    if nprocs == 4:
        owned = atoms_per_rank(run.output, "Nlocal")
        assert owned and owned[-1][0] == 0, f"no rank was left without atoms: {owned}"
    kk = read_dump(tmp_path / "kk" / "atoms.dump"), read_results(run.output)
    assert_matches_reference(f"kokkos/{name}/np{nprocs}", *kk, ref, cell)

    # the same LAMMPS with KOKKOS atoms and comm, the pair style without the suffix
    plain_script = script.replace("pair_style ", "suffix off\npair_style ", 1)
    plain = kokkos_lammps.run(plain_script, nprocs, tmp_path / "plugin").check()
    assert "pair nvalchemi, perpetual" in plain.output
    host = read_dump(tmp_path / "plugin" / "atoms.dump"), read_results(plain.output)
    assert_runs_agree(f"kokkos-vs-plugin/{name}/np{nprocs}", kk, host, tol=1e-10)


def _nve_script(data: str, model: Path, processors: str, steps: int) -> str:
    return (
        "units metal\natom_style atomic\natom_modify map array\n"
        f"{processors}\nread_data {data}\n"
        f"pair_style nvalchemi {model}\npair_coeff * * Ar Ne\n"
        "velocity all create 300.0 4928459 loop geom\n"
        "neighbor 1.0 bin\nneigh_modify every 1 delay 0 check yes\n"
        "fix 1 all nve\ntimestep 0.002\nthermo 50\n"
        f"run {steps}\n"
        "dump d all custom 1 final.dump id x y z vx vy vz fx fy fz\n"
        'dump_modify d sort id format float "%.17g"\n'
        "run 0\n" + print_results("RESULT", {"pe": "pe", "etotal": "etotal"})
    )


def test_md_equal_across_rank_counts(kokkos_lammps, mp_model, tmp_path):
    """200 NVE steps of the message-passing model (atoms migrate, lists are rebuilt, ghost
    features exchanged): 2 and 4 ranks against 1 rank, positions, velocities and forces by
    atom ID, and the total energy."""
    data, *_ = _slab(tmp_path)
    runs = {}
    for nprocs in (1, 2, 4):
        work = tmp_path / f"np{nprocs}"
        script = _nve_script(str(data), mp_model[1], f"processors 1 1 {nprocs}", 200)
        run = kokkos_lammps.run(script, nprocs, work).check()
        assert neighbor_list_builds(run.output)[0] > 0, "the lists were never rebuilt"
        runs[nprocs] = read_dump(work / "final.dump"), read_results(run.output)
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


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_ewald_through_kokkos(kokkos_lammps, nprocs, tmp_path):
    """A model that reads positions, charges and the cell (Ewald: per-atom forces on owned
    and ghost rows, and a virial beyond f.r), charges from LAMMPS's KOKKOS ``q``: energy,
    per-atom energy, forces and pressure against the reference and ``pair_style
    nvalchemi`` (no per-atom stress: the reference's per-atom virial is the pairwise part)."""
    from _ionic_systems import rock_salt

    from nvalchemi_lammps.potentials import Ewald

    positions, cell, species, charges = rock_salt(2, displacement=0.2, seed=5)
    potential = Ewald(["Na", "Cl"], cutoff=8.0, accuracy=1e-6)
    model = save_model(potential, tmp_path / "ewald.pt")
    data = write_lammps_data(
        tmp_path / "salt.data", positions, cell, species + 1, [22.98977, 35.453], charges
    )
    ref = evaluate_reference(potential, positions, cell, (True,) * 3, species, charges=charges)
    script = comparison_script(
        str(data), f"nvalchemi {model}", "Na Cl", f"processors 1 1 {nprocs}"
    ).replace("atom_style atomic", "atom_style charge")
    run = kokkos_lammps.run(script, nprocs, tmp_path / "kk").check()
    assert "pair nvalchemi/kk, perpetual" in run.output
    kk = read_dump(tmp_path / "kk" / "atoms.dump"), read_results(run.output)
    assert_matches_reference(f"kokkos/ewald/np{nprocs}", *kk, ref, cell, stress=False)
    plain_script = script.replace("pair_style ", "suffix off\npair_style ", 1)
    plain = kokkos_lammps.run(plain_script, nprocs, tmp_path / "plugin").check()
    host = read_dump(tmp_path / "plugin" / "atoms.dump"), read_results(plain.output)
    assert_runs_agree(f"kokkos-vs-plugin/ewald/np{nprocs}", kk, host, tol=1e-10)


@pytest.mark.parametrize("nprocs", [1, 2])
def test_non_finite_results_stop_every_rank(kokkos_lammps, lj_model, nprocs, tmp_path):
    """Two atoms on the same spot: the model's energy is not finite; the run stops on every
    rank, naming the atoms by ID."""
    positions, cell, species = ar_ne_slab(4)
    positions[1] = positions[0]
    data = write_lammps_data(tmp_path / "slab.data", positions, cell, species + 1, MASSES)
    script = comparison_script(
        str(data), f"nvalchemi {lj_model[1]}", "Ar Ne", f"processors 1 1 {nprocs}"
    )
    run = kokkos_lammps.run(script, nprocs, tmp_path / "kk")
    assert run.returncode != 0
    assert "Pair style nvalchemi/kk failed at step 0" in run.output, run.output[-3000:]
    assert "non-finite energies or forces on atoms 1 2" in run.output, run.output[-3000:]


def test_plugin_checks_hold_for_kokkos(kokkos_lammps, lj_model, tmp_path):
    """nvalchemi/kk is the plugin's pair style: its checks (here newton pair on) stop the run
    with the plugin's message."""
    data, *_ = _slab(tmp_path)
    script = "package kokkos newton off neigh full\n" + comparison_script(
        str(data), f"nvalchemi {lj_model[1]}", "Ar Ne"
    )
    run = kokkos_lammps.run(script, 1, tmp_path / "kk")
    assert run.returncode != 0
    assert "Pair style nvalchemi requires newton pair on" in run.output, run.output[-3000:]
