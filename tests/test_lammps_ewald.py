"""Ewald electrostatics through ``pair_style nvalchemi`` on 1, 2 and 4 ranks against
LAMMPS's own ``pair_style coul/long`` + ``kspace_style ewald``, and against itself on one
rank.

A probe run lets LAMMPS choose alpha (``G vector``) and ``kmax`` from ``kspace_style ewald
<accuracy>``; every later run, ours and LAMMPS's, uses those printed values explicitly
(``kspace_modify gewald ... kmax/ewald ...`` on the LAMMPS side), so both sum the same
series. What remains between the two is LAMMPS's polynomial approximation of ``erfc`` in
``coul/long`` (``pair_modify table 0``; relative error about 1e-6 of a pair term).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from lammps_helpers import NPROCS, PRESSURE, assert_all_close, print_results

from nvalchemi_lammps import Ewald, save_model
from nvalchemi_lammps.lammps_run import read_dump, read_results, run_lammps, write_lammps_data

pytestmark = pytest.mark.lammps

#: Rock salt, 5x5x5 conventional cells: 1,000 ions, each displaced ~0.2 Angstrom.
LATTICE, CELLS, DISPLACEMENT = 5.64, 5, 0.2
CUTOFF = 10.0
ACCURACY = 1e-6
MASSES = [22.98977, 35.453]
#: LAMMPS's erfc in coul/long is a polynomial fit (A&S 7.1.26, absolute error ~1e-7); with
#: alpha and the k-vectors matched that is the whole difference (measured: ~1e-7).
LAMMPS_TOLERANCE = 2e-6


def _rock_salt() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    fcc = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    grid = np.array(
        [[i, j, k] for i in range(CELLS) for j in range(CELLS) for k in range(CELLS)], float
    )
    sodium = (grid[:, None, :] + fcc[None]).reshape(-1, 3)
    chlorine = sodium + np.array([0.5, 0.0, 0.0])
    cell = np.eye(3) * LATTICE * CELLS
    rng = np.random.default_rng(11)
    frac = np.vstack([sodium, chlorine]) / CELLS
    positions = frac @ cell + rng.normal(0.0, DISPLACEMENT, size=frac.shape)
    positions = np.mod(positions, LATTICE * CELLS)
    types = np.repeat([1, 2], len(sodium))
    charges = np.where(types == 1, 1.0, -1.0)
    return positions, cell, types, charges


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> Path:
    positions, cell, types, charges = _rock_salt()
    path = tmp_path_factory.mktemp("nacl") / "nacl.data"
    return write_lammps_data(path, positions, cell, types, MASSES, charges=charges)


def _script(data: Path, interaction: str, atom_style: str = "charge") -> str:
    return textwrap.dedent(
        f"""\
        units metal
        atom_style {atom_style}
        atom_modify map array
        read_data {data}
        {interaction}
        thermo_style custom step pe {" ".join(PRESSURE)}
        dump d all custom 1 atoms.dump id fx fy fz
        dump_modify d sort id format float "%.17g"
        run 0
        """
    ) + print_results("RESULT", {"pe": "pe", **{p: p for p in PRESSURE}})


def _coul_long(kspace: str) -> str:
    return f"pair_style coul/long {CUTOFF}\npair_coeff * *\npair_modify table 0\n{kspace}"


@pytest.fixture(scope="module")
def lammps_choice(system, tmp_path_factory) -> tuple[float, tuple[int, int, int]]:
    """alpha and kmax per direction that ``kspace_style ewald ACCURACY`` picks (as printed)."""
    workdir = tmp_path_factory.mktemp("probe")
    run = run_lammps(
        _script(system, _coul_long(f"kspace_style ewald {ACCURACY}")), 1, workdir, timeout=300
    ).check()
    alpha = float(re.search(r"G vector \(1/distance\) = (\S+)", run.output).group(1))
    kmax = re.search(r"kxmax kymax kzmax\s+=\s+(\d+) (\d+) (\d+)", run.output).groups()
    return alpha, tuple(int(k) for k in kmax)


def _results(workdir: Path, output: str) -> dict[str, np.ndarray]:
    atoms, glob = read_dump(workdir / "atoms.dump"), read_results(output)
    return {
        "energy": np.array([glob["pe"]]),
        "force": np.stack([atoms[c] for c in ("fx", "fy", "fz")], axis=1),
        "pressure": np.array([glob[p] for p in PRESSURE]),
    }


@pytest.fixture(scope="module")
def lammps_ewald(system, lammps_choice, tmp_path_factory) -> dict[str, np.ndarray]:
    alpha, (kx, ky, kz) = lammps_choice
    workdir = tmp_path_factory.mktemp("lammps_ewald")
    kspace = (
        f"kspace_style ewald {ACCURACY}\nkspace_modify gewald {alpha!r} kmax/ewald {kx} {ky} {kz}"
    )
    run = run_lammps(_script(system, _coul_long(kspace)), 1, workdir, timeout=300).check()
    return _results(workdir, run.output)


@pytest.fixture(scope="module")
def model(lammps_choice, tmp_path_factory) -> Path:
    alpha, kmax = lammps_choice
    potential = Ewald(["Na", "Cl"], cutoff=CUTOFF, alpha=alpha, kmax=list(kmax))
    return save_model(potential, tmp_path_factory.mktemp("ewald") / "ewald.pt")


def _ours(system: Path, model: Path, nprocs: int, workdir: Path) -> dict[str, np.ndarray]:
    interaction = f"pair_style nvalchemi {model}\npair_coeff * * Na Cl"
    run = run_lammps(_script(system, interaction), nprocs, workdir, timeout=300).check()
    return _results(workdir, run.output)


@pytest.fixture(scope="module")
def ours_one_rank(system, model, tmp_path_factory) -> dict[str, np.ndarray]:
    return _ours(system, model, 1, tmp_path_factory.mktemp("ours_np1"))


def test_accuracy_gives_lammps_parameters(lammps_choice):
    """``Ewald(accuracy=...)`` derives the alpha and kmax LAMMPS prints for the same input."""
    import torch

    positions, cell, _, charges = _rock_salt()
    potential = Ewald(["Na", "Cl"], cutoff=CUTOFF, accuracy=ACCURACY)
    alpha, kmax = potential.parameters_for(
        torch.as_tensor(cell), float(len(positions)), float((charges**2).sum())
    )
    assert kmax == lammps_choice[1]
    assert alpha == pytest.approx(lammps_choice[0], rel=1e-7)  # LAMMPS prints 8 digits


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_ewald_equals_lammps_ewald(system, model, lammps_ewald, ours_one_rank, nprocs, tmp_path):
    ours = ours_one_rank if nprocs == 1 else _ours(system, model, nprocs, tmp_path)
    assert_all_close(
        f"ewald/vs-lammps-ewald/np{nprocs}",
        {q: (ours[q], lammps_ewald[q]) for q in ("energy", "force", "pressure")},
        tol=LAMMPS_TOLERANCE,
    )
    if nprocs > 1:
        assert_all_close(
            f"ewald/vs-one-rank/np{nprocs}",
            {q: (ours[q], ours_one_rank[q]) for q in ("energy", "force", "pressure")},
        )


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_ewald_without_charges_is_an_error(system, model, nprocs, tmp_path):
    positions, cell, types, _ = _rock_salt()
    data = write_lammps_data(tmp_path / "atomic.data", positions, cell, types, MASSES)
    interaction = f"pair_style nvalchemi {model}\npair_coeff * * Na Cl"
    run = run_lammps(_script(data, interaction, "atomic"), nprocs, tmp_path, timeout=120)
    assert run.returncode not in (0, -9), run.output[-2000:]
    assert "ewald needs per-atom charges" in run.output, run.output[-2000:]


def test_remaining_difference_is_the_erfc_fit_of_coul_long(lammps_choice, lammps_ewald):
    """Our energy with coul/long's polynomial erfc put in equals LAMMPS's to rounding: the
    ~1e-7 left between the two is LAMMPS's erfc fit, not the Ewald sum."""
    import torch

    from nvalchemi_lammps.reference import evaluate_reference

    alpha, kmax = lammps_choice
    positions, cell, types, charges = _rock_salt()
    potential = Ewald(["Na", "Cl"], cutoff=CUTOFF, alpha=alpha, kmax=list(kmax))
    ref = evaluate_reference(potential, positions, cell, (True,) * 3, types - 1, charges=charges)
    # coul/long with pair_modify table 0: EWALD_P and A1..A5 of pair_coul_long.cpp
    p, a = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
    r = np.linalg.norm(ref.pairs.rij, axis=1)
    t = 1.0 / (1.0 + p * alpha * r)
    fit = t * (a[0] + t * (a[1] + t * (a[2] + t * (a[3] + t * a[4])))) * np.exp(-((alpha * r) ** 2))
    exact = torch.special.erfc(torch.from_numpy(alpha * r)).numpy()
    qq = charges[ref.pairs.pair_i] * charges[ref.pairs.pair_j]
    shift = 0.5 * potential.qqr2e * np.sum(qq * (fit - exact) / r)
    assert_all_close(
        "ewald/vs-lammps-ewald-with-erfc-fit",
        {"energy": (np.array([ref.energy + shift]), lammps_ewald["energy"])},
        tol=1e-12,
    )
