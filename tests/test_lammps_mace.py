"""MACE through ``pair_style nvalchemi`` on 1, 2 and 4 ranks against the same model on the
whole periodic system without LAMMPS (``reference.py``), which ``test_mace.py`` checks
against mace-torch's own forward.

Each LAMMPS run reads one data file written here (atom IDs 1..N, whatever the rank count)
and evaluates it twice, ``strategy exchange`` (node features exchanged through LAMMPS's
communication between layers, ghost shell of one cutoff) and ``strategy shell`` (ghost
shell of two cutoffs, no exchange). Energy, per-atom energy, forces by atom ID, pressure
tensor (no velocities: the virial part alone) and per-atom virial stress must equal the
reference to 1e-10 relative; the two strategies each other to 1e-12.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from lammps_helpers import (
    MEASURED,
    NPROCS,
    PRESSURE,
    assert_matches_reference,
    assert_strategies_agree,
    atoms_per_rank,
)

from nvalchemi_lammps import save_model
from nvalchemi_lammps.lammps_run import read_dump, read_results, run_lammps, write_lammps_data
from nvalchemi_lammps.potentials import mace as mace_module
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.lammps

try:
    mace_module._mace()
except ImportError:  # pragma: no cover - mace-torch is an optional dependency
    pytest.skip("mace-torch is not installed", allow_module_level=True)

ELEMENTS = ["Ar", "Kr"]
MASSES = [39.948, 83.798]
FCC = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
STRATEGIES = ("exchange", "shell")


@dataclass(frozen=True)
class Structure:
    id: str
    positions: np.ndarray
    cell: np.ndarray  # rows a, b, c in LAMMPS's restricted triclinic form
    species: np.ndarray  # model element index; LAMMPS type = species + 1
    processors: dict[int, str]  # `processors` command per rank count


def _fcc(cells: tuple[int, int, int], cell: np.ndarray, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    grid = np.array(
        [[i, j, k] for i in range(cells[0]) for j in range(cells[1]) for k in range(cells[2])],
        dtype=np.float64,
    )
    frac = (grid[:, None, :] + FCC[None, :, :]).reshape(-1, 3) / np.array(cells)
    positions = frac @ cell + rng.normal(0.0, 0.1, size=frac.shape)
    species = (rng.random(len(frac)) < 0.4).astype(np.int64)
    return positions, cell, species


def _structures() -> list[Structure]:
    bulk = _fcc((3, 3, 3), 15.0 * np.eye(3), seed=1)  # 108 atoms
    # a skewed cell with a lattice vector shorter than r_max: atoms see their own images
    tric = _fcc((1, 1, 2), np.array([[3.8, 0.0, 0.0], [1.2, 4.6, 0.0], [-0.9, 1.1, 9.8]]), 2)
    # atoms in z = 1..11 of 25: split along z, one rank (2 ranks) or two (4) own nothing
    slab_cell = np.diag([15.0, 15.0, 25.0])
    slab = _fcc((3, 3, 2), np.diag([15.0, 15.0, 10.0]), seed=3)
    slab = (slab[0] + [0.0, 0.0, 1.0], *slab[1:])
    return [
        Structure("bulk", *bulk, processors={}),
        # 4 slabs of 3.75 Angstrom along x, thinner than r_max
        Structure(
            "thin-subdomains", *bulk, processors={2: "processors 2 1 1", 4: "processors 4 1 1"}
        ),
        Structure("triclinic-self-images", *tric, processors={}),
        Structure(
            "empty-ranks",
            slab[0],
            slab_cell,
            slab[2],
            processors={2: "processors 1 1 2", 4: "processors 1 1 4"},
        ),
    ]


STRUCTURES = {s.id: s for s in _structures()}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The small random ScaleShiftMACE of test_mace.py (2 layers, ZBL repulsion)."""
    from _mace_models import VARIANTS, random_mace

    potential = mace_module.Mace.from_model(random_mace(**VARIANTS["scale_shift"]))
    path = save_model(potential, tmp_path_factory.mktemp("mace") / "mace.pt")
    return potential, path


PER_ATOM = ["fx", "fy", "fz", "c_pe", *(f"c_stress[{k}]" for k in range(1, 7))]


def comparison_script(
    structure: Structure, data: Path, model: Path, nprocs: int, strategies=STRATEGIES
) -> str:
    """``run 0`` under each strategy in one LAMMPS process: a dump and a print each."""
    lines = [
        textwrap.dedent(
            f"""\
            units metal
            atom_style atomic
            atom_modify map array
            {structure.processors.get(nprocs, "")}
            read_data {data.name}
            compute pe all pe/atom
            compute stress all stress/atom NULL virial
            thermo_style custom step pe {" ".join(PRESSURE)}
            """
        )
    ]
    for strategy in strategies:
        values = " ".join(f"{p} $({p}:%.17g)" for p in ("pe", *PRESSURE))
        lines.append(
            textwrap.dedent(
                f"""
                pair_style nvalchemi {model} strategy {strategy}
                pair_coeff * * {" ".join(ELEMENTS)}
                dump d all custom 1 {strategy}.dump id {" ".join(PER_ATOM)}
                dump_modify d sort id format float "%.17g"
                run 0
                undump d
                print "{strategy.upper()} {values}"
                """
            )
        )
    return "".join(lines)


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
@pytest.mark.parametrize("structure", STRUCTURES.values(), ids=STRUCTURES.keys())
def test_mace_equals_reference(structure, nprocs, model, tmp_path):
    potential, path = model
    ref = evaluate_reference(
        potential, structure.positions, structure.cell, (True, True, True), structure.species
    )

    data = write_lammps_data(
        tmp_path / "system.data", structure.positions, structure.cell, structure.species + 1, MASSES
    )
    script = comparison_script(structure, data, path, nprocs)
    run = run_lammps(script, nprocs, tmp_path, timeout=600).check()
    if structure.id == "empty-ranks" and nprocs > 1:
        owned = atoms_per_rank(run.output, "Nlocal")  # (fewest, most) per run
        assert len(owned) == 2 and all(fewest == 0 for fewest, _ in owned), owned

    got = {}
    for strategy in STRATEGIES:
        atoms = read_dump(tmp_path / f"{strategy}.dump")
        np.testing.assert_array_equal(atoms["id"], np.arange(1, len(ref.forces) + 1))
        glob = read_results(run.output, strategy.upper())
        got[strategy] = atoms, glob
        assert_matches_reference(
            f"mace/{structure.id}/{strategy}/np{nprocs}", atoms, glob, ref, structure.cell
        )

    assert_strategies_agree(
        f"mace/{structure.id}/exchange-vs-shell/np{nprocs}", got["exchange"], got["shell"]
    )


# --- on cuEquivariance's kernels (issue 16) -------------------------------------------------


@pytest.fixture(scope="module")
def cueq_model(model, tmp_path_factory):
    """The same model and weights, its file asking for cuEquivariance's kernels (on the CPU:
    cuEquivariance's pure-torch operations, mace-torch's conversion on every rank)."""
    potential, _ = model
    on_cueq = type(potential).from_config({**potential.config(), "kernels": "cuequivariance"})
    on_cueq.load_state_dict(potential.state_dict())
    assert on_cueq.kernels == "cuequivariance"
    return save_model(on_cueq, tmp_path_factory.mktemp("mace-cueq") / "mace-cueq.pt")


@pytest.mark.skipif(
    not mace_module._cueq_available(), reason="cuequivariance-torch is not installed"
)
@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_mace_on_cuequivariance_equals_reference(nprocs, model, cueq_model, tmp_path):
    """Subdomains thinner than the cutoff, node features exchanged between layers: the
    cuEquivariance network through LAMMPS equals the e3nn network on the whole system."""
    potential, _ = model
    structure = STRUCTURES["thin-subdomains"]
    ref = evaluate_reference(
        potential, structure.positions, structure.cell, (True, True, True), structure.species
    )
    data = write_lammps_data(
        tmp_path / "system.data", structure.positions, structure.cell, structure.species + 1, MASSES
    )
    script = comparison_script(structure, data, cueq_model, nprocs, strategies=("exchange",))
    run = run_lammps(script, nprocs, tmp_path, timeout=600).check()
    atoms = read_dump(tmp_path / "exchange.dump")
    np.testing.assert_array_equal(atoms["id"], np.arange(1, len(ref.forces) + 1))
    assert_matches_reference(
        f"mace/cuequivariance/{structure.id}/exchange/np{nprocs}",
        atoms,
        read_results(run.output, "EXCHANGE"),
        ref,
        structure.cell,
    )


# --- dynamics ------------------------------------------------------------------------------

NVE_STEPS = 500
ENERGY_EVERY = 10


def nve_script(data: Path, model: Path) -> str:
    """500 NVE steps of the bulk structure from 300 K; a small skin rebuilds the neighbor
    lists (atoms migrate between ranks) many times."""
    return textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        atom_modify map array
        read_data {data.name}
        velocity all create 300 4928459 loop geom
        neighbor 0.3 bin
        neigh_modify every 1 delay 0 check yes
        timestep 0.002
        pair_style nvalchemi {model} strategy exchange
        pair_coeff * * {" ".join(ELEMENTS)}
        fix nve all nve
        thermo {ENERGY_EVERY}
        thermo_style custom step temp pe ke etotal
        fix energy all print {ENERGY_EVERY} "$(step) $(etotal:%.17g) $(ke:%.17g)" &
            file energy.txt screen no
        run {NVE_STEPS}
        """
    )


def test_nve_drift_two_ranks_like_one(model, tmp_path):
    """Energy conservation on 2 ranks is no worse than on 1.

    Criterion: with E(t) the total energy every 10 steps, the drift max_t |E(t) - E(0)|
    on 2 ranks is at most 1.1 x that on 1 rank plus 1e-10 |E(0)| (the static agreement),
    and the two runs' E(t) agree to the same 1e-10 |E(0)| at every step: the forces are
    the same to rounding, so the trajectories stay together and so must the energies.
    The drift itself is checked to be far larger than that tolerance, or the comparison
    would say nothing.
    """
    _, path = model
    bulk = STRUCTURES["bulk"]
    energies = {}
    for nprocs in (1, 2):
        workdir = tmp_path / f"np{nprocs}"
        workdir.mkdir()
        data = write_lammps_data(
            workdir / "system.data", bulk.positions, bulk.cell, bulk.species + 1, MASSES
        )
        run = run_lammps(nve_script(data, path), nprocs, workdir, timeout=600).check()
        steps, etotal, _kinetic = np.loadtxt(workdir / "energy.txt", comments="#", unpack=True)
        assert steps[0] == 0 and steps[-1] == NVE_STEPS
        energies[nprocs] = etotal
        if nprocs == 2:
            builds = [
                int(line.split()[-1])
                for line in run.output.splitlines()
                if line.startswith("Neighbor list builds")
            ]
            assert builds and builds[-1] >= 5, builds
    one, two = energies[1], energies[2]
    drift_one = float(np.max(np.abs(one - one[0])))
    drift_two = float(np.max(np.abs(two - two[0])))
    tolerance = 1e-10 * abs(one[0])
    MEASURED.append(("mace/nve", "drift_np1_eV", drift_one))
    MEASURED.append(("mace/nve", "drift_np2_eV", drift_two))
    MEASURED.append(
        ("mace/nve", "max|E_np2-E_np1|/|E0|", float(np.max(np.abs(two - one))) / abs(one[0]))
    )
    assert drift_one > 100 * tolerance, "the energy barely moves: nothing to compare"
    assert drift_two <= 1.1 * drift_one + tolerance, (drift_one, drift_two)
    assert float(np.max(np.abs(two - one))) <= tolerance, np.max(np.abs(two - one))
