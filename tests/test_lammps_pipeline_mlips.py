"""Composed pipelines through ``pair_style nvalchemi``, in float64:

- MACE + DFT-D3(BJ) + PME (+ a Lennard-Jones wall, as random MACE weights repel nothing) on
  displaced rock-salt NaCl (64 ions, charges +-0.5 from LAMMPS's ``atom_style charge``);
- AIMNet2 whose predicted charges feed PME, on a small box of molecules, neutral and with
  ``pair_style ... charge 1`` (PME then with its neutralizing background).

On 1, 2 and 4 ranks (AIMNet2's: 1 and 4) each equals the same pipeline on the whole periodic
system without LAMMPS to 1e-10 relative (energy, per-atom energy, forces by atom ID,
pressure); 500 NVE steps on 1 and 2 ranks give the same total energy at every step and
conserve it.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from _aimnet2_models import molecular_box, random_aimnet2
from _mace_models import random_mace
from lammps_helpers import MEASURED, NPROCS, PRESSURE, assert_matches_reference, print_results

from nvalchemi_lammps import DFTD3, LennardJones, Pipeline, Pme, save_model
from nvalchemi_lammps.lammps_run import read_dump, read_results, run_lammps, write_lammps_data
from nvalchemi_lammps.potentials.mace import Mace
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.lammps

NVE_STEPS, ENERGY_EVERY = 500, 10


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
        # molecules start to fall after ~40 fs: 500 steps of 0.05 fs stay before that
        0.00005,
        300.0,
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


#: ranks per case: AIMNet2's at 1 and 4 (about 15 s of CPU per rank for its imports; 2 ranks
#: repeat the 4 ranks' charge equilibration over ranks, and its NVE run below compares 2 ranks
#: with 1 at every step)
RANKS = {"mace+d3+pme": NPROCS, "aimnet2->pme/charge0": [1, 4], "aimnet2->pme/charge1": [1, 4]}


@pytest.mark.parametrize(
    ("case_id", "nprocs"),
    [(c, n) for c in CASES for n in RANKS[c]],
    ids=[f"{c}-np{n}" for c in CASES for n in RANKS[c]],
)
def test_pipeline_equals_reference(case_id, nprocs, prepared, tmp_path):
    case = CASES[case_id]
    data, model, ref = prepared[case_id]
    script = _header(case, data, model) + textwrap.dedent(
        f"""\
        compute pe all pe/atom
        thermo_style custom step pe {" ".join(PRESSURE)}
        dump d all custom 1 atoms.dump id fx fy fz c_pe
        dump_modify d sort id format float "%.17g"
        run 0
        """
    )
    script += print_results("RESULT", {"pe": "pe", **{p: p for p in PRESSURE}})
    run = run_lammps(script, nprocs, tmp_path, timeout=600).check()
    atoms, glob = read_dump(tmp_path / "atoms.dump"), read_results(run.output)
    assert_matches_reference(f"{case_id}/np{nprocs}", atoms, glob, ref, case.cell, stress=False)


@pytest.mark.parametrize("case_id", ["mace+d3+pme", "aimnet2->pme/charge1"])
def test_nve_conserves_energy_on_two_ranks_as_on_one(case_id, prepared, tmp_path):
    """500 NVE steps: E(t) on 2 ranks equals E(t) on 1 rank to 1e-10 |E(0)| every 10 steps
    (the forces agree to rounding, so the trajectories stay together), and the total
    energy stays within 1 % of the kinetic energy's scale (3/2 N kT) of its start — what
    remains is the integrator's fluctuation and the small steps where a pair crosses D3's
    and PME's sharp real-space cutoffs."""
    case = CASES[case_id]
    data, model, _ = prepared[case_id]
    energies = {}
    for nprocs in (1, 2):
        workdir = tmp_path / f"np{nprocs}"
        script = _header(case, data, model) + textwrap.dedent(
            f"""\
            velocity all create {case.temperature} 4928459 loop geom
            neighbor 0.5 bin
            neigh_modify every 1 delay 0 check yes
            timestep {case.timestep}
            fix nve all nve
            thermo 100
            fix energy all print {ENERGY_EVERY} "$(step) $(etotal:%.17g) $(ke:%.17g)" &
                file energy.txt screen no
            run {NVE_STEPS}
            """
        )
        run_lammps(script, nprocs, workdir, timeout=900).check()
        steps, etotal, _kinetic = np.loadtxt(workdir / "energy.txt", unpack=True)
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
