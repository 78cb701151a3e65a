"""Composed pipelines through ``pair_style nvalchemi``, in float64:

- MACE + DFT-D3(BJ) + PME (+ a Lennard-Jones wall, as random MACE weights repel nothing) on
  displaced rock-salt NaCl (64 ions, charges +-0.5 from LAMMPS's ``atom_style charge``);
- AIMNet2 whose predicted charges feed PME, on a small box of molecules, neutral and with
  ``pair_style ... charge 1`` (PME then with its neutralizing background).

On 1, 2 and 4 ranks each equals the same pipeline on the whole periodic system without
LAMMPS to 1e-10 relative (energy, per-atom energy, forces by atom ID, pressure); 200 NVE
steps (several neighbor-list builds) on 1 and 2 ranks give the same total energy at every
step and conserve it. All the runs on one rank count are segments of one LAMMPS process
(``clear`` between them): the ranks start, and import mace-torch and aimnet, once per rank
count.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from _aimnet2_models import molecular_box, random_aimnet2
from _mace_models import random_mace
from lammps_helpers import (
    MEASURED,
    NPROCS,
    OWNER_DUMP,
    PRESSURE,
    assert_matches_reference,
    atoms_migrated,
    neighbor_list_builds,
    print_results,
    run_segments,
)

from nvalchemi_lammps import DFTD3, LennardJones, Pipeline, Pme, save_model
from nvalchemi_lammps.lammps_run import read_dump, read_results, write_lammps_data
from nvalchemi_lammps.potentials.mace import Mace
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.lammps

NVE_STEPS, ENERGY_EVERY = 200, 10
#: The NVE runs' neighbor skin, and the fewest neighbor-list builds each must make
NVE_SKIN, NVE_MIN_BUILDS = 0.2, 3


@dataclass(frozen=True)
class Case:
    id: str
    pipeline: Pipeline
    positions: np.ndarray
    cell: np.ndarray
    species: np.ndarray
    masses: list[float]
    charges: np.ndarray | None  # LAMMPS per-atom charges (atom_style charge)
    total_charge: float  # pair_style ... charge Q
    timestep: float  # ps
    temperature: float
    #: commands before the NVE run (after ``read_data``)
    nve_setup: str = ""

    @property
    def elements(self) -> list[str]:
        return list(self.pipeline.spec.elements)


def _rock_salt(cells: int = 2, a: float = 5.64, seed: int = 3):
    fcc = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 3)
    sodium = (grid[:, None, :] + fcc[None]).reshape(-1, 3)
    frac = np.vstack([sodium, sodium + [0.5, 0.0, 0.0]]) / cells
    cell = np.eye(3) * a * cells
    rng = np.random.default_rng(seed)
    positions = np.mod(frac @ cell + rng.normal(0.0, 0.1, frac.shape), a * cells)
    species = np.repeat([0, 1], len(sodium))
    return positions, cell, species


def mace_d3_pme() -> Case:
    positions, cell, species = _rock_salt()
    elements = ["Na", "Cl"]
    mace = Mace.from_model(random_mace(atomic_numbers=[11, 17], seed=2), dtype="float64")
    d3 = DFTD3(elements, cutoff=9.0, cn_cutoff=6.0, functional="pbe")
    # alpha large enough that the real-space sum is negligible at its cutoff (energy
    # steps of ~1e-6 eV when a pair crosses it), the mesh fine enough for that alpha
    pme = Pme(elements, cutoff=5.6, alpha=0.6, mesh=16, order=5)
    # random MACE weights repel nothing: a Lennard-Jones wall keeps the ions apart
    wall = LennardJones(
        elements,
        epsilon={"Na": 0.05, "Cl": 0.05},
        sigma={"Na": 2.1, "Cl": 3.1},
        cutoff=5.6,
        shift=True,
    )
    return Case(
        "mace+d3+pme",
        Pipeline([mace, d3, pme, wall]),
        positions,
        cell,
        species,
        [22.98977, 35.453],
        np.where(species == 0, 0.5, -0.5),
        0.0,
        0.001,
        300.0,
    )


def aimnet2_pme(total_charge: float) -> Case:
    system = molecular_box()
    half_spacing = system.cell[0, 0] / 4  # 2 x 2 x 2 molecules
    elements = list(system.elements)
    aimnet2 = random_aimnet2(seed=0, dtype="float64")
    pme = Pme(elements, cutoff=6.0, alpha=0.5, mesh=12, order=5, background=total_charge != 0)
    return Case(
        f"aimnet2->pme/charge{total_charge:g}",
        Pipeline([aimnet2, pme], charges_from=[None, 0]),
        system.positions,
        system.cell,
        system.species,
        [1.008, 12.011, 14.007, 15.999],
        None,
        total_charge,
        # random weights give a landscape without a repulsive core, into which the
        # molecules start to fall after ~40 fs: the NVE run's steps of 0.05 fs stay before that
        0.00005,
        300.0,
        # the molecules sit on a grid whose planes halfway between them are where 2 ranks
        # split the box: moved by half a spacing (a periodic translation) they straddle
        # the split, and some atom changes rank within the run
        f"displace_atoms all move {half_spacing} {half_spacing} {half_spacing}\n",
    )


CASES = {c.id: c for c in (mace_d3_pme(), aimnet2_pme(0.0), aimnet2_pme(1.0))}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, tuple[Path, Path, object]]:
    """Per case: data file, model file and the reference without LAMMPS."""
    out = {}
    for case in CASES.values():
        workdir = tmp_path_factory.mktemp(case.id.replace("/", "_").replace(">", ""))
        data = write_lammps_data(
            workdir / "system.data",
            case.positions,
            case.cell,
            case.species + 1,
            case.masses,
            charges=case.charges,
        )
        model = save_model(case.pipeline, workdir / "pipeline.pt")
        ref = evaluate_reference(
            case.pipeline,
            case.positions,
            case.cell,
            (True, True, True),
            case.species,
            charges=case.charges,
            total_charge=case.total_charge,
        )
        out[case.id] = (data, model, ref)
    return out


def _header(case: Case, data: Path, model: Path) -> str:
    style = "charge" if case.charges is not None else "atomic"
    return textwrap.dedent(
        f"""\
        units metal
        atom_style {style}
        atom_modify map array
        read_data {data}
        pair_style nvalchemi {model} charge {case.total_charge!r}
        pair_coeff * * {" ".join(case.elements)}
        """
    )


#: NVE runs: these cases, on 1 rank and on 2
NVE_CASES, NVE_RANKS = ["mace+d3+pme", "aimnet2->pme/charge1"], [1, 2]


def _slug(case_id: str) -> str:
    return case_id.replace("/", "_").replace(">", "")


def _run0_script(case: Case, data: Path, model: Path) -> str:
    slug = _slug(case.id)
    return (
        _header(case, data, model)
        + textwrap.dedent(
            f"""\
            compute pe all pe/atom
            thermo_style custom step pe {" ".join(PRESSURE)}
            dump d all custom 1 {slug}.dump id fx fy fz c_pe
            dump_modify d sort id format float "%.17g"
            run 0
            """
        )
        + print_results("RESULT", {"pe": "pe", **{p: p for p in PRESSURE}})
    )


def _nve_script(case: Case, data: Path, model: Path) -> str:
    slug = _slug(case.id)
    return (
        _header(case, data, model)
        + textwrap.dedent(
            f"""\
            velocity all create {case.temperature} 4928459 loop geom
            neighbor {NVE_SKIN} bin
            neigh_modify every 1 delay 0 check yes
            timestep {case.timestep}
            {case.nve_setup}
            fix nve all nve
            thermo 100
            fix energy all print {ENERGY_EVERY} "$(step) $(etotal:%.17g) $(ke:%.17g)" &
                file {slug}.energy screen no
            """
        )
        + OWNER_DUMP.format(every=NVE_STEPS, path=f"{slug}.owner")
        + f"run {NVE_STEPS}\n"
    )


@pytest.fixture(scope="module")
def runs(prepared, tmp_path_factory):
    """All of this module's LAMMPS runs on one rank count in one LAMMPS process, ``clear``
    between them (the ranks import torch, mace-torch and aimnet once): every case's ``run
    0`` and, on :data:`NVE_RANKS`, the NVE runs; made when a test first asks:
    ``runs(nprocs) -> (workdir, {segment name: its output})``, the NVE runs' segments named
    ``CASE/nve``."""
    cache = {}

    def run(nprocs: int):
        if nprocs not in cache:
            workdir = tmp_path_factory.mktemp(f"np{nprocs}")
            scripts = {c.id: _run0_script(c, *prepared[c.id][:2]) for c in CASES.values()}
            if nprocs in NVE_RANKS:
                for case_id in NVE_CASES:
                    case = CASES[case_id]
                    scripts[f"{case_id}/nve"] = _nve_script(case, *prepared[case_id][:2])
            outputs = run_segments(scripts, nprocs, workdir, timeout=2400)
            cache[nprocs] = workdir, outputs
        return cache[nprocs]

    return run


@pytest.mark.parametrize(
    ("case_id", "nprocs"),
    [(c, n) for c in CASES for n in NPROCS],
    ids=[f"{c}-np{n}" for c in CASES for n in NPROCS],
)
def test_pipeline_equals_reference(case_id, nprocs, prepared, runs):
    case = CASES[case_id]
    _, _, ref = prepared[case_id]
    workdir, outputs = runs(nprocs)
    atoms = read_dump(workdir / f"{_slug(case_id)}.dump")
    glob = read_results(outputs[case_id])
    assert_matches_reference(f"{case_id}/np{nprocs}", atoms, glob, ref, case.cell, stress=False)


@pytest.mark.parametrize("case_id", NVE_CASES)
def test_nve_conserves_energy_on_two_ranks_as_on_one(case_id, runs):
    """200 NVE steps (NVE_STEPS), with a skin small enough that the neighbor lists are rebuilt
    several times (and some atom changes rank on 2 ranks): E(t) on 2 ranks equals E(t) on 1 rank
    to 1e-10 |E(0)| every 10 steps (the forces agree to rounding, so the trajectories stay
    together), and the total energy stays within 1 % of the kinetic energy's scale
    (3/2 N kT) of its start — what remains is the integrator's fluctuation and the small
    steps where a pair crosses D3's and PME's sharp real-space cutoffs."""
    case = CASES[case_id]
    energies = {}
    for nprocs in NVE_RANKS:
        workdir, outputs = runs(nprocs)
        builds = neighbor_list_builds(outputs[f"{case_id}/nve"])
        assert len(builds) == 1 and builds[0] >= NVE_MIN_BUILDS, builds
        if nprocs > 1:
            assert atoms_migrated(workdir / f"{_slug(case_id)}.owner") > 0
        steps, etotal, _kinetic = np.loadtxt(workdir / f"{_slug(case_id)}.energy", unpack=True)
        assert steps[-1] == NVE_STEPS
        energies[nprocs] = etotal
    one, two = energies[1], energies[2]
    natoms = len(case.positions)
    thermal = 1.5 * natoms * 8.617333262e-5 * case.temperature
    drift = float(np.max(np.abs(one - one[0])))
    MEASURED.append((f"{case_id}/nve", "max|E(t)-E(0)|/(3/2 NkT)", drift / thermal))
    MEASURED.append(
        (f"{case_id}/nve", "max|E_np2-E_np1|/|E0|", float(np.max(np.abs(two - one))) / abs(one[0]))
    )
    assert drift <= 0.01 * thermal, (drift, thermal)
    assert float(np.max(np.abs(two - one))) <= 1e-10 * abs(one[0])
