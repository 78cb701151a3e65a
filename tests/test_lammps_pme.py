"""PME electrostatics through ``pair_style nvalchemi`` on 1, 2 and 4 ranks against LAMMPS's
own ``pair_style coul/long`` + ``kspace_style pppm`` at the same accuracy, in a periodic box
and in a slab (``boundary p p f``, ``kspace_modify slab 3.0``), and against itself on one
rank.

Both sides derive the same alpha and mesh from the accuracy (checked against what LAMMPS
prints) and spread charges with the same order-5 B-spline, but they are different methods
on that mesh: LAMMPS's PPPM differentiates in k-space (ik) with its optimal influence
function, our smooth PME differentiates its own energy (autograd). Each has a
discretization error of the size of the requested accuracy, which is LAMMPS's RMS force
error relative to the force between two unit charges 1 A apart (``qqr2e``). So:

- forces: RMS over atoms of ``|F_ours - F_lammps|`` within ``2 x accuracy x qqr2e`` (each
  side off by up to about ``accuracy x qqr2e``);
- energy and pressure: within ``accuracy``, relative;
- each side against the exact Ewald sum (our Ewald, same alpha, converged k-space): its
  RMS force error within ``accuracy x qqr2e``.

In the slab, LAMMPS's error estimate takes the charges as spread over the whole extended
box, and the mesh it derives along z is too coarse for the accuracy (measured at 1e-5:
RMS force error 1.4e-5 for LAMMPS's pppm, 3.0e-5 for ours, nearly all along z). Both sides
therefore run the slab on a mesh twice as fine along z (``kspace_modify mesh`` / ``mesh``,
alpha then balanced for it by both), which meets the accuracy; the derived mesh is still
checked against LAMMPS's.

Ours on 2 and 4 ranks equals ours on 1 rank to 1e-10.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from _ionic_lammps import (
    CUTOFF,
    SLAB_FACTOR,
    coul_long,
    ionic_data,
    lammps_script,
    molten_salt,
    read_outputs,
    slab_rock_salt,
    slab_setup,
)
from lammps_helpers import MEASURED, NPROCS, assert_all_close, atoms_per_rank

from nvalchemi_lammps import save_model
from nvalchemi_lammps.lammps_run import run_lammps
from nvalchemi_lammps.potentials.ewald import QQR2E, Ewald
from nvalchemi_lammps.potentials.pme import Pme
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.lammps

ACCURACY = 1e-5
#: The slab's mesh: the derived one (27 27 80) with z twice as fine (docstring).
SLAB_MESH = [27, 27, 160]
#: k-vectors per direction of the exact Ewald sum (z of the slab over its extended box):
#: beyond them exp(-k^2 / 4 alpha^2) < 1e-12 at the derived alpha (about 0.31).
EXACT_KMAX = {"periodic": [15, 15, 15], "slab": [15, 15, 62]}


def _systems() -> dict:
    return {"periodic": molten_salt(), "slab": slab_rock_salt()}


def _pbc(geometry: str) -> tuple[bool, bool, bool]:
    return (True, True, geometry == "periodic")


def _extra(geometry: str) -> dict:
    """Our PME's arguments beyond the accuracy for this geometry (as run in LAMMPS)."""
    return {} if geometry == "periodic" else {"slab": SLAB_FACTOR, "mesh": SLAB_MESH}


def _setup(geometry: str, nprocs: int) -> str:
    return "" if geometry == "periodic" else slab_setup(nprocs)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pme_data")
    return {geometry: ionic_data(folder, geometry) for geometry in ("periodic", "slab")}


@pytest.fixture(scope="module")
def lammps_pppm(data, tmp_path_factory) -> dict[str, tuple[dict, str]]:
    """LAMMPS's coul/long + pppm at ACCURACY, one rank: results and printed output. The
    slab input first initializes with the derived mesh (``run 0`` before any output), then
    runs on SLAB_MESH."""
    runs = {}
    for geometry, path in data.items():
        workdir = tmp_path_factory.mktemp(f"lammps_pppm_{geometry}")
        kspace = f"kspace_style pppm {ACCURACY}"
        if geometry == "slab":
            mesh = " ".join(map(str, SLAB_MESH))
            kspace += f"\nkspace_modify slab {SLAB_FACTOR}\nrun 0\nkspace_modify mesh {mesh}"
        script = lammps_script(path, coul_long(kspace), setup=_setup(geometry, 1))
        run = run_lammps(script, 1, workdir, timeout=300).check()
        runs[geometry] = (read_outputs(workdir, run.output), run.output)
    return runs


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pme_models")
    return {
        geometry: save_model(
            Pme(["Na", "Cl"], cutoff=CUTOFF, accuracy=ACCURACY, **_extra(geometry)),
            folder / f"pme_{geometry}.pt",
        )
        for geometry in ("periodic", "slab")
    }


def _ours(data: Path, model: Path, geometry: str, nprocs: int, workdir: Path) -> tuple:
    interaction = f"pair_style nvalchemi {model}\npair_coeff * * Na Cl"
    script = lammps_script(data, interaction, setup=_setup(geometry, nprocs))
    run = run_lammps(script, nprocs, workdir, timeout=300).check()
    return read_outputs(workdir, run.output), run.output


@pytest.fixture(scope="module")
def ours_one_rank(data, models, tmp_path_factory) -> dict[str, dict]:
    return {
        geometry: _ours(
            data[geometry], models[geometry], geometry, 1, tmp_path_factory.mktemp("ours_np1")
        )[0]
        for geometry in ("periodic", "slab")
    }


def _rms_force(got: np.ndarray, ref: np.ndarray) -> float:
    """RMS over atoms of the force difference, relative to ``qqr2e`` (LAMMPS's measure)."""
    return float(np.sqrt(((got - ref) ** 2).sum(axis=1).mean()) / QQR2E["metal"])


@pytest.mark.parametrize(
    "geometry, mesh, init",
    [("periodic", None, 0), ("slab", None, 0), ("slab", SLAB_MESH, 1)],
    ids=["periodic", "slab", "slab-given-mesh"],
)
def test_accuracy_gives_lammps_parameters(lammps_pppm, geometry, mesh, init):
    """``Pme(accuracy=...)`` derives the alpha and mesh ``kspace_style pppm`` prints (the
    ``init``-th initialization of that input); with a given mesh, the alpha."""
    positions, cell, _, charges = _systems()[geometry]
    slab = {} if geometry == "periodic" else {"slab": SLAB_FACTOR}
    potential = Pme(["Na", "Cl"], cutoff=CUTOFF, accuracy=ACCURACY, mesh=mesh, **slab)
    alpha, derived = potential.parameters_for(
        torch.as_tensor(cell), float(len(positions)), float((charges**2).sum())
    )
    output = lammps_pppm[geometry][1]
    grid = re.findall(r"grid = (\d+) (\d+) (\d+)", output)[init]
    assert derived == tuple(int(n) for n in grid)
    assert re.findall(r"stencil order = (\d+)", output)[init] == str(potential.order)
    lammps_alpha = float(re.findall(r"G vector \(1/distance\) = (\S+)", output)[init])
    assert alpha == pytest.approx(lammps_alpha, rel=1e-7)  # LAMMPS prints 8 digits


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
@pytest.mark.parametrize("geometry", ["periodic", "slab"])
def test_pme_equals_lammps_pppm(
    data, models, lammps_pppm, ours_one_rank, geometry, nprocs, tmp_path
):
    if nprocs == 1:
        ours = ours_one_rank[geometry]
    else:
        ours, output = _ours(data[geometry], models[geometry], geometry, nprocs, tmp_path)
        if geometry == "slab" and nprocs == 4:  # the top subdomain is vacuum
            assert min(lo for lo, _ in atoms_per_rank(output)) == 0
    lammps = lammps_pppm[geometry][0]
    label = f"pme-{geometry}/vs-lammps-pppm/np{nprocs}"
    assert_all_close(label, {q: (ours[q], lammps[q]) for q in ("energy", "pressure")}, tol=ACCURACY)
    rms = _rms_force(ours["force"], lammps["force"])
    MEASURED.append((label, "force rms/qqr2e", rms))
    assert rms <= 2.0 * ACCURACY, f"{label}: RMS force difference {rms:.3e} x qqr2e"
    if nprocs > 1:
        assert_all_close(
            f"pme-{geometry}/vs-one-rank/np{nprocs}",
            {q: (ours[q], ours_one_rank[geometry][q]) for q in ("energy", "force", "pressure")},
        )


@pytest.mark.parametrize("geometry", ["periodic", "slab"])
def test_each_side_is_within_the_accuracy_of_the_exact_sum(lammps_pppm, ours_one_rank, geometry):
    """Each method's own error: its forces against the Ewald sum with the same alpha and
    real-space cutoff, summed over a converged set of k-vectors."""
    positions, cell, types, charges = _systems()[geometry]
    pme = Pme(["Na", "Cl"], cutoff=CUTOFF, accuracy=ACCURACY, **_extra(geometry))
    alpha, _ = pme.parameters_for(
        torch.as_tensor(cell), float(len(positions)), float((charges**2).sum())
    )
    ewald = Ewald(
        ["Na", "Cl"],
        cutoff=CUTOFF,
        alpha=alpha,
        kmax=EXACT_KMAX[geometry],
        slab=_extra(geometry).get("slab"),
    )
    exact = evaluate_reference(ewald, positions, cell, _pbc(geometry), types - 1, charges)
    for side, forces in (
        ("ours", ours_one_rank[geometry]["force"]),
        ("lammps", lammps_pppm[geometry][0]["force"]),
    ):
        rms = _rms_force(forces, exact.forces)
        MEASURED.append((f"pme-{geometry}/{side}-vs-exact-ewald", "force rms/qqr2e", rms))
        assert rms <= ACCURACY, f"{side} ({geometry}): RMS force error {rms:.3e} x qqr2e"


def test_pme_without_slab_on_a_slab_box_is_an_error(data, models, tmp_path):
    interaction = f"pair_style nvalchemi {models['periodic']}\npair_coeff * * Na Cl"
    script = lammps_script(data["slab"], interaction, setup=slab_setup(2))
    run = run_lammps(script, 2, tmp_path, timeout=120)
    assert run.returncode not in (0, -9), run.output[-2000:]
    # refused at the run's setup on every rank (error->all), not at each rank's first step
    message = "ERROR: pair_style nvalchemi: pme without slab needs a box periodic in x, y and z"
    assert message in run.output, run.output[-2000:]
