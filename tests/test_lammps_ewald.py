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

import functools
import re
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from lammps_helpers import NPROCS, PRESSURE, assert_all_close, atoms_per_rank, print_results

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


def rock_salt(
    cells_z: int = CELLS, periodic_z: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    fcc = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    grid = np.array(
        [[i, j, k] for i in range(CELLS) for j in range(CELLS) for k in range(cells_z)], float
    )
    sodium = (grid[:, None, :] + fcc[None]).reshape(-1, 3)
    chlorine = sodium + np.array([0.5, 0.0, 0.0])
    cell = np.diag([LATTICE * CELLS, LATTICE * CELLS, LATTICE * cells_z])
    rng = np.random.default_rng(11)
    frac = np.vstack([sodium, chlorine]) / np.array([CELLS, CELLS, cells_z])
    positions = frac @ cell + rng.normal(0.0, DISPLACEMENT, size=frac.shape)
    wrapped = 3 if periodic_z else 2
    positions[:, :wrapped] = np.mod(positions[:, :wrapped], np.diag(cell)[:wrapped])
    types = np.repeat([1, 2], len(sodium))
    charges = np.where(types == 1, 1.0, -1.0)
    return positions, cell, types, charges


#: Tosi-Fumi NaCl for ``pair_style born/coul/long`` (metal units: A, rho, sigma, C, D), only
#: to melt the crystal for the periodic system.
BORN_MAYER_HUGGINS = {
    (1, 1): "0.263690 0.317 2.340 1.048553 -0.49935",
    (1, 2): "0.210917 0.317 2.755 6.99055303 -8.6757",
    (2, 2): "0.158221 0.317 3.170 72.4077 -145.427",
}
MELT_TEMPERATURE, MELT_STEPS = 2500.0, 2000


@functools.cache
def molten_salt() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 1,000-ion crystal of :func:`rock_salt` melted by LAMMPS: Born-Mayer-Huggins +
    Coulomb (PPPM), NVT at 2,500 K for 2 ps at the crystal's density (NaCl melts at
    1,074 K): a liquid's disorder, ions as close as the melt brings them."""
    positions, cell, types, charges = rock_salt()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        data = write_lammps_data(workdir / "crystal.data", positions, cell, types, MASSES, charges)
        coefficients = "\n".join(
            f"pair_coeff {i} {j} {v}" for (i, j), v in BORN_MAYER_HUGGINS.items()
        )
        script = textwrap.dedent(
            f"""            units metal
            atom_style charge
            read_data {data}
            pair_style born/coul/long 9.0
            {{coefficients}}
            kspace_style pppm 1e-4
            velocity all create {MELT_TEMPERATURE} 8675309 loop geom
            fix nvt all nvt temp {MELT_TEMPERATURE} {MELT_TEMPERATURE} 0.1
            timestep 0.001
            thermo 500
            run {MELT_STEPS}
            write_dump all custom melt.dump id x y z modify sort id format float "%.17g"
            """
        ).replace("{coefficients}", coefficients)
        run_lammps(script, 1, workdir, timeout=300).check()
        melt = read_dump(workdir / "melt.dump")
    melted = np.stack([melt[c] for c in ("x", "y", "z")], axis=1)
    return np.mod(melted, np.diag(cell)), cell, types, charges


#: The slab: rock salt 5x5x4 cells (800 ions), Na shifted up and Cl down along z (a dipole
#: normal to the slab, whose correction is then large), from z = 2 A in a box 40 A high.
SLAB_CELLS, SLAB_SHIFT, SLAB_BOTTOM, SLAB_HEIGHT, SLAB_FACTOR = 4, 0.1, 2.0, 40.0, 3.0
#: Subdomains stacked along z: at 4 ranks the top quarter (z > 30 A) holds no atom.
SLAB_PROCESSORS = {1: "", 2: "processors 1 1 2", 4: "processors 1 1 4"}


def slab_rock_salt() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    positions, cell, types, charges = rock_salt(SLAB_CELLS, periodic_z=False)
    positions[:, 2] += np.where(types == 1, SLAB_SHIFT, -SLAB_SHIFT) + SLAB_BOTTOM
    cell[2, 2] = SLAB_HEIGHT
    return positions, cell, types, charges


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> Path:
    positions, cell, types, charges = molten_salt()
    path = tmp_path_factory.mktemp("nacl") / "nacl.data"
    return write_lammps_data(path, positions, cell, types, MASSES, charges=charges)


def lammps_script(data: Path, interaction: str, atom_style: str = "charge", setup: str = "") -> str:
    return textwrap.dedent(
        f"""\
        units metal
        atom_style {atom_style}
        atom_modify map array
        {setup}
        read_data {data}
        {interaction}
        thermo_style custom step pe {" ".join(PRESSURE)}
        dump d all custom 1 atoms.dump id fx fy fz
        dump_modify d sort id format float "%.17g"
        run 0
        """
    ) + print_results("RESULT", {"pe": "pe", **{p: p for p in PRESSURE}})


def coul_long(kspace: str) -> str:
    return f"pair_style coul/long {CUTOFF}\npair_coeff * *\npair_modify table 0\n{kspace}"


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


def read_outputs(workdir: Path, output: str) -> dict[str, np.ndarray]:
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
    positions, cell, types, charges = slab_rock_salt()
    path = tmp_path_factory.mktemp("slab") / "slab.data"
    return write_lammps_data(path, positions, cell, types, MASSES, charges=charges)


def slab_setup(nprocs: int) -> str:
    return f"boundary p p f\n{SLAB_PROCESSORS[nprocs]}"


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
