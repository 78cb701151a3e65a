"""Ewald electrostatics through ``pair_style nvalchemi`` on 1, 2 and 4 ranks against
LAMMPS's own ``pair_style coul/long`` + ``kspace_style ewald``, and against itself on one
rank: a periodic box, and a slab (``boundary p p f``, ``kspace_modify slab 3.0``).

A probe run lets LAMMPS choose alpha (``G vector``) and ``kmax`` from ``kspace_style ewald
<accuracy>``; every later run, ours and LAMMPS's, uses those printed values explicitly
(``kspace_modify gewald ... kmax/ewald ...`` on the LAMMPS side), so both sum the same
series. What remains between the two is LAMMPS's polynomial approximation of ``erfc`` in
``coul/long`` (``pair_modify table 0``; relative error about 1e-6 of a pair term). The slab
runs derive alpha and kmax on both sides from the accuracy (the test checks they are the
same) and put the empty top of the box on a rank of its own at 4 ranks.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from _ionic_lammps import (
    ACCURACY,
    CUTOFF,
    LAMMPS_TOLERANCE,
    MASSES,
    SLAB_FACTOR,
    coul_long,
    ionic_data,
    lammps_script,
    molten_salt,
    read_outputs,
    slab_rock_salt,
    slab_setup,
)
from lammps_helpers import NPROCS, assert_all_close, atoms_per_rank

from nvalchemi_lammps import Ewald, save_model
from nvalchemi_lammps.lammps_run import run_lammps, write_lammps_data

pytestmark = pytest.mark.lammps


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> Path:
    return ionic_data(tmp_path_factory.mktemp("nacl"), "periodic")


@pytest.fixture(scope="module")
def lammps_choice(system, tmp_path_factory) -> tuple[float, tuple[int, int, int]]:
    """alpha and kmax per direction that ``kspace_style ewald ACCURACY`` picks (as printed)."""
    workdir = tmp_path_factory.mktemp("probe")
    run = run_lammps(
        lammps_script(system, coul_long(f"kspace_style ewald {ACCURACY}")), 1, workdir, timeout=300
    ).check()
    alpha = float(re.search(r"G vector \(1/distance\) = (\S+)", run.output).group(1))
    kmax = re.search(r"kxmax kymax kzmax\s+=\s+(\d+) (\d+) (\d+)", run.output).groups()
    return alpha, tuple(int(k) for k in kmax)


@pytest.fixture(scope="module")
def lammps_ewald(system, lammps_choice, tmp_path_factory) -> dict[str, np.ndarray]:
    alpha, (kx, ky, kz) = lammps_choice
    workdir = tmp_path_factory.mktemp("lammps_ewald")
    kspace = (
        f"kspace_style ewald {ACCURACY}\nkspace_modify gewald {alpha!r} kmax/ewald {kx} {ky} {kz}"
    )
    run = run_lammps(lammps_script(system, coul_long(kspace)), 1, workdir, timeout=300).check()
    return read_outputs(workdir, run.output)


@pytest.fixture(scope="module")
def model(lammps_choice, tmp_path_factory) -> Path:
    alpha, kmax = lammps_choice
    potential = Ewald(["Na", "Cl"], cutoff=CUTOFF, alpha=alpha, kmax=list(kmax))
    return save_model(potential, tmp_path_factory.mktemp("ewald") / "ewald.pt")


def _ours(system: Path, model: Path, nprocs: int, workdir: Path) -> dict[str, np.ndarray]:
    interaction = f"pair_style nvalchemi {model}\npair_coeff * * Na Cl"
    run = run_lammps(lammps_script(system, interaction), nprocs, workdir, timeout=300).check()
    return read_outputs(workdir, run.output)


@pytest.fixture(scope="module")
def ours_one_rank(system, model, tmp_path_factory) -> dict[str, np.ndarray]:
    return _ours(system, model, 1, tmp_path_factory.mktemp("ours_np1"))


def test_accuracy_gives_lammps_parameters(lammps_choice):
    """``Ewald(accuracy=...)`` derives the alpha and kmax LAMMPS prints for the same input."""
    import torch

    positions, cell, _, charges = molten_salt()
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
    positions, cell, types, _ = molten_salt()
    data = write_lammps_data(tmp_path / "atomic.data", positions, cell, types, MASSES)
    interaction = f"pair_style nvalchemi {model}\npair_coeff * * Na Cl"
    run = run_lammps(lammps_script(data, interaction, "atomic"), nprocs, tmp_path, timeout=120)
    assert run.returncode not in (0, -9), run.output[-2000:]
    assert "ewald needs per-atom charges" in run.output, run.output[-2000:]


def erfc_fit_shift(ref, charges: np.ndarray, alpha: float, qqr2e: float) -> float:
    """What coul/long's polynomial erfc (``pair_modify table 0``: ``EWALD_P`` and ``A1..A5``
    of ``pair_coul_long.cpp``) adds to the real-space energy of the reference's pairs."""
    import torch

    p, a = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
    r = np.linalg.norm(ref.pairs.rij, axis=1)
    t = 1.0 / (1.0 + p * alpha * r)
    fit = t * (a[0] + t * (a[1] + t * (a[2] + t * (a[3] + t * a[4])))) * np.exp(-((alpha * r) ** 2))
    exact = torch.special.erfc(torch.from_numpy(alpha * r)).numpy()
    qq = charges[ref.pairs.pair_i] * charges[ref.pairs.pair_j]
    return 0.5 * qqr2e * np.sum(qq * (fit - exact) / r)


def test_remaining_difference_is_the_erfc_fit_of_coul_long(lammps_choice, lammps_ewald):
    """Our energy with coul/long's polynomial erfc put in equals LAMMPS's to rounding: the
    ~1e-7 left between the two is LAMMPS's erfc fit, not the Ewald sum."""
    from nvalchemi_lammps.reference import evaluate_reference

    alpha, kmax = lammps_choice
    positions, cell, types, charges = molten_salt()
    potential = Ewald(["Na", "Cl"], cutoff=CUTOFF, alpha=alpha, kmax=list(kmax))
    ref = evaluate_reference(potential, positions, cell, (True,) * 3, types - 1, charges=charges)
    shift = erfc_fit_shift(ref, charges, alpha, potential.qqr2e)
    assert_all_close(
        "ewald/vs-lammps-ewald-with-erfc-fit",
        {"energy": (np.array([ref.energy + shift]), lammps_ewald["energy"])},
        tol=1e-12,
    )


@pytest.fixture(scope="module")
def slab(tmp_path_factory) -> Path:
    return ionic_data(tmp_path_factory.mktemp("slab"), "slab")


@pytest.fixture(scope="module")
def lammps_ewald_slab(slab, tmp_path_factory) -> tuple[dict[str, np.ndarray], str]:
    workdir = tmp_path_factory.mktemp("lammps_ewald_slab")
    kspace = f"kspace_style ewald {ACCURACY}\nkspace_modify slab {SLAB_FACTOR}"
    script = lammps_script(slab, coul_long(kspace), setup=slab_setup(1))
    run = run_lammps(script, 1, workdir, timeout=300).check()
    return read_outputs(workdir, run.output), run.output


@pytest.fixture(scope="module")
def slab_model(tmp_path_factory) -> Path:
    potential = Ewald(["Na", "Cl"], cutoff=CUTOFF, accuracy=ACCURACY, slab=SLAB_FACTOR)
    return save_model(potential, tmp_path_factory.mktemp("ewald_slab") / "ewald_slab.pt")


def _ours_slab(slab: Path, model: Path, nprocs: int, workdir: Path) -> tuple[dict, str]:
    interaction = f"pair_style nvalchemi {model}\npair_coeff * * Na Cl"
    script = lammps_script(slab, interaction, setup=slab_setup(nprocs))
    run = run_lammps(script, nprocs, workdir, timeout=300).check()
    return read_outputs(workdir, run.output), run.output


@pytest.fixture(scope="module")
def ours_slab_one_rank(slab, slab_model, tmp_path_factory) -> dict[str, np.ndarray]:
    return _ours_slab(slab, slab_model, 1, tmp_path_factory.mktemp("ours_slab_np1"))[0]


def test_slab_accuracy_gives_lammps_parameters(lammps_ewald_slab):
    """With a slab, alpha from the unextended box and kmax along z over the extended one,
    as ``Ewald::init``: the values LAMMPS prints for the same input."""
    import torch

    positions, cell, _, charges = slab_rock_salt()
    potential = Ewald(["Na", "Cl"], cutoff=CUTOFF, accuracy=ACCURACY, slab=SLAB_FACTOR)
    alpha, kmax = potential.parameters_for(
        torch.as_tensor(cell), float(len(positions)), float((charges**2).sum())
    )
    output = lammps_ewald_slab[1]
    printed = re.search(r"kxmax kymax kzmax\s+=\s+(\d+) (\d+) (\d+)", output).groups()
    assert kmax == tuple(int(k) for k in printed)
    lammps_alpha = float(re.search(r"G vector \(1/distance\) = (\S+)", output).group(1))
    assert alpha == pytest.approx(lammps_alpha, rel=1e-7)


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_slab_ewald_equals_lammps_ewald_slab(
    slab, slab_model, lammps_ewald_slab, ours_slab_one_rank, nprocs, tmp_path
):
    """The same series and the same dipole correction as LAMMPS's: equal up to coul/long's
    erfc fit. LAMMPS puts the correction into no virial, and neither do we."""
    if nprocs == 1:
        ours = ours_slab_one_rank
    else:
        ours, output = _ours_slab(slab, slab_model, nprocs, tmp_path)
        if nprocs == 4:  # the top subdomain is vacuum: a rank with no atoms
            assert min(lo for lo, _ in atoms_per_rank(output)) == 0
    quantities = ("energy", "force", "pressure")
    assert_all_close(
        f"ewald-slab/vs-lammps-ewald-slab/np{nprocs}",
        {q: (ours[q], lammps_ewald_slab[0][q]) for q in quantities},
        tol=LAMMPS_TOLERANCE,
    )
    if nprocs > 1:
        assert_all_close(
            f"ewald-slab/vs-one-rank/np{nprocs}",
            {q: (ours[q], ours_slab_one_rank[q]) for q in quantities},
        )


def test_slab_difference_is_the_erfc_fit_of_coul_long(lammps_ewald_slab):
    """With the slab too, only coul/long's erfc fit separates our energy from LAMMPS's: the
    extended k-space box and the dipole correction (here 1.7e-3 of the energy) are
    LAMMPS's to rounding."""
    import torch
    from test_ewald import slab_energy

    from nvalchemi_lammps.reference import evaluate_reference

    positions, cell, types, charges = slab_rock_salt()
    potential = Ewald(["Na", "Cl"], cutoff=CUTOFF, accuracy=ACCURACY, slab=SLAB_FACTOR)
    alpha, _ = potential.parameters_for(
        torch.as_tensor(cell), float(len(positions)), float((charges**2).sum())
    )
    ref = evaluate_reference(potential, positions, cell, (True, True, False), types - 1, charges)
    correction = slab_energy(positions, cell, charges, SLAB_FACTOR)
    assert abs(correction) > 1e-3 * abs(ref.energy)
    shift = erfc_fit_shift(ref, charges, alpha, potential.qqr2e)
    assert_all_close(
        "ewald-slab/vs-lammps-ewald-slab-with-erfc-fit",
        {"energy": (np.array([ref.energy + shift]), lammps_ewald_slab[0]["energy"])},
        tol=1e-12,
    )
