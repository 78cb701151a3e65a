"""Both KOKKOS doors on NVIDIA GPUs, exact: ``pair_style nvalchemi/kk`` and ``pair_style
mliap unified`` (our model file) in a KOKKOS CUDA LAMMPS (``tools/build_lammps_kokkos.sh``
and ``tools/build_plugin_kokkos.sh`` at PREFIX, found through
``NVALCHEMI_LAMMPS_KOKKOS_CUDA=PREFIX``; ``MPIRUN`` the launcher of its MPI, default
``mpirun --oversubscribe``), ``-k on g N -sf kk -pk kokkos newton on neigh half``.

Every model (Lennard-Jones, a 3-layer message-passing model, MACE in float64 and float32
where mace-torch is importable) on 1 rank, 2 ranks on one GPU, 2 ranks of which one owns no
atom, and 2 ranks on 2 GPUs where there are two: energy, per-atom energies, forces,
pressure and per-atom stress against the single-process reference by atom ID (1e-10
relative in float64, 1e-5 in float32). Then 200 NVE steps of the message-passing model on
2 ranks end where 1 rank ends.

    NVALCHEMI_LAMMPS_KOKKOS_CUDA=PREFIX .venv/bin/python -m pytest -m gpu tests/gpu
"""

from __future__ import annotations

import os
import shlex
import site
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _systems import ar_ne_slab
from lammps_helpers import (
    assert_matches_reference,
    atoms_per_rank,
    comparison_script,
    per_atom,
)

from nvalchemi_lammps import LennardJones, MessagePassing, save_model
from nvalchemi_lammps.lammps_run import read_dump, read_results, run_command, write_lammps_data
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.lammps

KOKKOS = ["-sf", "kk", "-pk", "kokkos", "newton", "on", "neigh", "half"]
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
MASSES = [39.948, 20.1797]
#: (label, ranks, GPUs, processors grid): the slab fills the lower 40 % of its box, so
#: splitting along z leaves the upper rank without atoms
RUNS = [
    ("1rank", 1, 1, ""),
    ("2ranks-1gpu", 2, 1, "processors 2 1 1"),
    ("2ranks-1gpu-empty", 2, 1, "processors 1 1 2"),
    ("2ranks-2gpus", 2, 2, "processors 2 1 1"),
]
DOORS = {"kk": "nvalchemi {model} device cuda", "mliap": "mliap unified {model} 0"}


def _models() -> dict[str, object]:
    lj = LennardJones(
        ["Ar", "Ne"], {"Ar": 0.0104, "Ne": 0.00312}, {"Ar": 3.40, "Ne": 2.74}, cutoff=6.0
    )
    models = {"lj": lj, "mpnn": MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3)}
    try:
        from _mace_models import random_mace

        from nvalchemi_lammps.potentials.mace import Mace

        mace = random_mace(r_max=5.0, atomic_numbers=[18, 10])
    except ImportError:  # no mace-torch here
        return models
    models["mace64"] = Mace.from_model(mace, dtype="float64")
    models["mace32"] = Mace.from_model(mace, dtype="float32")
    return models


@pytest.fixture(scope="module")
def kokkos_cuda(cuda) -> tuple[Path, dict[str, str], list[str]]:
    """The ``lmp``, its environment, and the MPI launcher."""
    prefix = os.environ.get("NVALCHEMI_LAMMPS_KOKKOS_CUDA")
    if not prefix:
        pytest.skip("NVALCHEMI_LAMMPS_KOKKOS_CUDA is not set: no KOKKOS CUDA LAMMPS here")
    prefix = Path(prefix)
    install = prefix / "install"
    libdir = next(install.glob("lib*/liblammps.so")).parent
    paths = [prefix / "python", *site.getsitepackages(), os.environ.get("PYTHONPATH", "")]
    env = {
        "LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}",
        "PYTHONPATH": ":".join(str(p) for p in paths if str(p)),
        "LAMMPS_PLUGIN_PATH": str(prefix / "plugin-build" / "cpp_bridge"),
        "NVALCHEMI_LAMMPS_PYTHON": sys.executable,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    mpirun = shlex.split(os.environ.get("MPIRUN", "mpirun --oversubscribe"))
    return install / "bin" / "lmp", env, mpirun


def _run(kokkos_cuda, script: str, ranks: int, gpus: int, workdir: Path):
    lmp, env, mpirun = kokkos_cuda
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "in.lammps").write_text(script)
    cmd = [*mpirun, "-np", str(ranks), str(lmp), "-k", "on", "g", str(gpus), *KOKKOS]
    return run_command([*cmd, "-in", "in.lammps"], workdir, timeout=600, env=env).check()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[object, Path]]:
    folder = tmp_path_factory.mktemp("kokkos-cuda")
    return {
        name: (potential, save_model(potential.eval(), folder / f"{name}.pt"))
        for name, potential in _models().items()
    }


@pytest.mark.parametrize("door", list(DOORS))
@pytest.mark.parametrize("label, ranks, gpus, processors", RUNS, ids=[r[0] for r in RUNS])
def test_door_equals_reference(kokkos_cuda, models, door, label, ranks, gpus, processors, tmp_path):
    import torch

    if gpus > torch.cuda.device_count():
        pytest.skip(f"{gpus} GPUs wanted, {torch.cuda.device_count()} here")
    positions, cell, species = ar_ne_slab(4)
    data = write_lammps_data(tmp_path / "slab.data", positions, cell, species + 1, MASSES)
    for name, (potential, path) in models.items():
        ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
        script = comparison_script(str(data), DOORS[door].format(model=path), "Ar Ne", processors)
        run = _run(kokkos_cuda, script, ranks, gpus, tmp_path / name)
        if "empty" in label:
            assert atoms_per_rank(run.output)[-1][0] == 0, "no rank was left without atoms"
        atoms, results = read_dump(tmp_path / name / "atoms.dump"), read_results(run.output)
        tol = TOLERANCE[potential.spec.dtype]
        assert_matches_reference(f"{door}/{name}/{label}", atoms, results, ref, cell, tol=tol)


@pytest.mark.parametrize("door", list(DOORS))
def test_message_passing_md_on_two_ranks_equals_one(kokkos_cuda, models, door, tmp_path):
    positions, cell, species = ar_ne_slab(4)
    data = write_lammps_data(tmp_path / "slab.data", positions, cell, species + 1, MASSES)
    pair_style = DOORS[door].format(model=models["mpnn"][1])
    ends = {}
    for ranks, processors in ((1, ""), (2, "processors 2 1 1")):
        script = textwrap.dedent(
            f"""\
            units metal
            atom_style atomic
            atom_modify map array
            {processors}
            read_data {data}
            pair_style {pair_style}
            pair_coeff * * Ar Ne
            velocity all create 300.0 4928 mom yes rot yes
            fix 1 all nve
            run 200
            write_dump all custom final.dump id x y z vx vy vz modify sort id format float %.17g
            """
        )
        _run(kokkos_cuda, script, ranks, 1, tmp_path / str(ranks))
        ends[ranks] = read_dump(tmp_path / str(ranks) / "final.dump")
    for columns in (["x", "y", "z"], ["vx", "vy", "vz"]):
        got, want = per_atom(ends[2], columns), per_atom(ends[1], columns)
        assert np.abs(got - want).max() <= 1e-10 * np.abs(want).max(), columns
