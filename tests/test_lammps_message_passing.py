"""Message-passing models through ``pair_style nvalchemi`` on 1, 2 and 4 ranks against the
same model on the whole periodic system without LAMMPS (``reference.py``), with the model as
a parameter: ``mpnn`` (the package's own ``MessagePassing``, 3 layers) and ``mace`` (the small
random ScaleShiftMACE of ``test_mace.py``, 2 layers, ZBL repulsion, which that module checks
against mace-torch's own forward).

Each LAMMPS run reads one data file written here (atom IDs 1..N, whatever the rank count)
and evaluates it twice, ``strategy exchange`` (node features exchanged through LAMMPS's
communication between layers, ghost shell of one cutoff) and ``strategy shell`` (ghost
shell of ``layers x cutoff``, no exchange). Energy, per-atom energy, forces by atom ID,
pressure tensor (no velocities: the virial part alone) and per-atom virial stress must equal
the reference to 1e-10 relative; the two strategies each other to 1e-12. Each model runs on
its own four structures (bulk, subdomains thinner than the cutoff, a triclinic cell smaller
than the cutoff, a slab that leaves ranks empty), sized to its cutoff.

MACE alone, further down: its cuEquivariance kernels, and NVE energy conservation.
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
    assert_matches_reference,
    assert_strategies_agree,
    atoms_per_rank,
    read_evaluation,
    run0_evaluation,
    run0_header,
)

from nvalchemi_lammps import MessagePassing, save_model
from nvalchemi_lammps.lammps_run import run_lammps, write_lammps_data
from nvalchemi_lammps.potentials import mace as mace_module
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.lammps

try:
    mace_module._mace()
    HAVE_MACE = True
except ImportError:  # pragma: no cover - mace-torch is an optional dependency
    HAVE_MACE = False
needs_mace = pytest.mark.skipif(not HAVE_MACE, reason="mace-torch is not installed")

FCC = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
STRATEGIES = ("exchange", "shell")


@dataclass(frozen=True)
class Structure:
    id: str
    positions: np.ndarray
    cell: np.ndarray  # rows a, b, c in LAMMPS's restricted triclinic form
    species: np.ndarray  # model element index; LAMMPS type = species + 1
    processors: dict[int, str]  # `processors` command per rank count


def _fcc(cells, cell: np.ndarray, seed: int, noise: float, second: float) -> tuple:
    """fcc cells filling ``cell``, rattled by ``noise``, a share ``second`` of the second
    element."""
    rng = np.random.default_rng(seed)
    grid = np.array(
        [[i, j, k] for i in range(cells[0]) for j in range(cells[1]) for k in range(cells[2])],
        dtype=np.float64,
    )
    frac = (grid[:, None, :] + FCC[None, :, :]).reshape(-1, 3) / np.array(cells)
    positions = frac @ cell + rng.normal(0.0, noise, size=frac.shape)
    species = (rng.random(len(frac)) < second).astype(np.int64)
    return positions, cell, species


def _mpnn_structures() -> list[Structure]:
    """For a cutoff of 5 Angstrom."""

    def fcc(cells, cell, seed):
        return _fcc(cells, cell, seed, noise=0.12, second=0.35)

    bulk = fcc((4, 4, 4), np.diag([16.4] * 3), seed=1)
    # 4 ranks along x: each subdomain is 4.1 Angstrom thick, thinner than the cutoff
    thin = fcc((4, 2, 2), np.diag([16.4, 8.2, 8.2]), seed=2)
    # a skewed cell smaller than the cutoff: atoms see their own periodic images
    tric = fcc((1, 1, 1), np.array([[6.0, 0.0, 0.0], [1.7, 5.6, 0.0], [-1.1, 1.3, 5.9]]), 3)
    # atoms fill the lower 40% of z only: with 4 ranks along z two ranks own nothing
    slab = fcc((3, 3, 2), np.diag([3 * 4.1, 3 * 4.1, 8.2]), seed=4)
    slab_cell = np.diag([3 * 4.1, 3 * 4.1, 2.5 * 8.2])
    return [
        Structure("bulk", *bulk, processors={}),
        Structure("thin-subdomains", *thin, processors={4: "processors 4 1 1"}),
        Structure("triclinic-self-images", *tric, processors={}),
        Structure(
            "empty-ranks",
            slab[0] + [0.0, 0.0, 1.0],  # none wraps to the top of the box
            slab_cell,
            slab[2],
            processors={2: "processors 1 1 2", 4: "processors 1 1 4"},
        ),
    ]


def _mace_structures() -> list[Structure]:
    """For MACE's r_max of 4 Angstrom."""

    def fcc(cells, cell, seed):
        return _fcc(cells, cell, seed, noise=0.1, second=0.4)

    bulk = fcc((3, 3, 3), 15.0 * np.eye(3), seed=1)  # 108 atoms
    # a skewed cell with a lattice vector shorter than r_max: atoms see their own images
    tric = fcc((1, 1, 2), np.array([[3.8, 0.0, 0.0], [1.2, 4.6, 0.0], [-0.9, 1.1, 9.8]]), 2)
    # atoms in z = 1..11 of 25: split along z, one rank (2 ranks) or two (4) own nothing
    slab = fcc((3, 3, 2), np.diag([15.0, 15.0, 10.0]), seed=3)
    return [
        Structure("bulk", *bulk, processors={}),
        # 4 slabs of 3.75 Angstrom along x, thinner than r_max
        Structure(
            "thin-subdomains", *bulk, processors={2: "processors 2 1 1", 4: "processors 4 1 1"}
        ),
        Structure("triclinic-self-images", *tric, processors={}),
        Structure(
            "empty-ranks",
            slab[0] + [0.0, 0.0, 1.0],
            np.diag([15.0, 15.0, 25.0]),
            slab[2],
            processors={2: "processors 1 1 2", 4: "processors 1 1 4"},
        ),
    ]


def _mpnn():
    return MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, features=12, seed=7)


def _mace():
    from _mace_models import VARIANTS, random_mace

    return mace_module.Mace.from_model(random_mace(**VARIANTS["scale_shift"]))


#: Each model: how to build it, its elements and masses, its structures.
MODELS = {
    "mpnn": (_mpnn, ["Ar", "Ne"], [39.948, 20.1797], _mpnn_structures()),
    "mace": (_mace, ["Ar", "Kr"], [39.948, 83.798], _mace_structures()),
}
#: The MACE model's structures, for the MACE-only tests below.
STRUCTURES = {s.id: s for s in MODELS["mace"][3]}
ELEMENTS, MASSES = MODELS["mace"][1], MODELS["mace"][2]
#: ranks per structure, where they show something of their own: bulk at 1, 2 and 4;
#: thin-subdomains at 4, the one count whose subdomains are thinner than the cutoff (at 1
#: and 2 it repeats bulk: for MACE the same atoms); triclinic-self-images at 1 and 4; the
#: empty ranks at 2 and 4 (at 1 there is none)
RANKS = {
    "bulk": NPROCS,
    "thin-subdomains": [4],
    "triclinic-self-images": [1, 4],
    "empty-ranks": [2, 4],
}
CASES = [
    pytest.param(
        name,
        s,
        nprocs,
        id=f"{name}-{s.id}-np{nprocs}",
        marks=[needs_mace] if name == "mace" else [],
    )
    for name, (_, _, _, structures) in MODELS.items()
    for s in structures
    for nprocs in RANKS[s.id]
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each model, built once and saved: ``built(name) -> (potential, path)``."""
    cache = {}

    def build(name: str):
        if name not in cache:
            potential = MODELS[name][0]()
            path = save_model(potential, tmp_path_factory.mktemp(name) / f"{name}.pt")
            cache[name] = potential, path
        return cache[name]

    return build


@pytest.fixture(scope="module")
def model(built):
    """The small random ScaleShiftMACE of test_mace.py (2 layers, ZBL repulsion)."""
    return built("mace")


def comparison_script(
    structure: Structure, data: Path, model: Path, nprocs: int, elements, strategies=STRATEGIES
) -> str:
    """``run 0`` under each strategy in one LAMMPS process: a dump and a print each."""
    lines = [run0_header(data.name, structure.processors.get(nprocs, ""))]
    for strategy in strategies:
        lines.append(f"pair_style nvalchemi {model} strategy {strategy}\n")
        lines.append(f"pair_coeff * * {' '.join(elements)}\n")
        lines.append(run0_evaluation(strategy))
    return "".join(lines)


@pytest.mark.parametrize(("name", "structure", "nprocs"), CASES)
def test_message_passing_equals_reference(name, structure, nprocs, built, tmp_path):
    potential, path = built(name)
    _, elements, masses, _ = MODELS[name]
    ref = evaluate_reference(
        potential, structure.positions, structure.cell, (True, True, True), structure.species
    )

    data = write_lammps_data(
        tmp_path / "system.data", structure.positions, structure.cell, structure.species + 1, masses
    )
    script = comparison_script(structure, data, path, nprocs, elements)
    run = run_lammps(script, nprocs, tmp_path, timeout=600).check()
    if structure.id == "empty-ranks" and nprocs > 1:
        owned = atoms_per_rank(run.output, "Nlocal")  # (fewest, most) per run
        assert len(owned) == 2 and all(fewest == 0 for fewest, _ in owned), owned

    got = {}
    for strategy in STRATEGIES:
        ids = np.arange(1, len(ref.forces) + 1)
        atoms, glob = got[strategy] = read_evaluation(tmp_path, run.output, strategy, ids)
        assert_matches_reference(
            f"{name}/{structure.id}/{strategy}/np{nprocs}", atoms, glob, ref, structure.cell
        )

    assert_strategies_agree(
        f"{name}/{structure.id}/exchange-vs-shell/np{nprocs}", got["exchange"], got["shell"]
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


@needs_mace
@pytest.mark.skipif(
    not HAVE_MACE or not mace_module._cueq_available(),
    reason="cuequivariance-torch is not installed",
)
# 1 rank, and 4 where the subdomains are thinner than r_max (2 ranks: bulk's exchange)
@pytest.mark.parametrize("nprocs", [1, 4], ids=["np1", "np4"])
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
    script = comparison_script(
        structure, data, cueq_model, nprocs, ELEMENTS, strategies=("exchange",)
    )
    run = run_lammps(script, nprocs, tmp_path, timeout=600).check()
    ids = np.arange(1, len(ref.forces) + 1)
    atoms, results = read_evaluation(tmp_path, run.output, "exchange", ids)
    label = f"mace/cuequivariance/{structure.id}/exchange/np{nprocs}"
    assert_matches_reference(label, atoms, results, ref, structure.cell)


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


@needs_mace
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
