"""Message-passing models through ``pair_style nvalchemi`` on 1, 2 and 4 ranks against the
same model on the whole periodic system without LAMMPS (``reference.py``), with the model as
a parameter: ``mpnn`` (the package's own ``MessagePassing``, 3 layers) and ``mace`` (the small
random ScaleShiftMACE of ``test_mace.py``, 2 layers, ZBL repulsion, which that module checks
against mace-torch's own forward).

Each comparison reads one data file written here (atom IDs 1..N, whatever the rank count)
and evaluates it twice, ``strategy exchange`` (node features exchanged through LAMMPS's
communication between layers, ghost shell of one cutoff) and ``strategy shell`` (ghost
shell of ``layers x cutoff``, no exchange). All the comparisons on one rank count, and the
MACE runs below, are segments of one LAMMPS process (``clear`` between them): the ranks
start, and import torch and mace-torch, once per rank count. Energy, per-atom energy, forces by atom ID,
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
    OWNER_DUMP,
    assert_matches_reference,
    assert_strategies_agree,
    atoms_migrated,
    atoms_per_rank,
    neighbor_list_builds,
    read_evaluation,
    run0_evaluation,
    run0_header,
    run_segments,
)

from nvalchemi_lammps import MessagePassing, save_model
from nvalchemi_lammps.lammps_run import write_lammps_data
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
#: ranks per model and structure, where they show something of their own. Message passing
#: (a cheap model on every rank): bulk at 1, 2 and 4; thin-subdomains at 4, the one count
#: whose subdomains are thinner than the cutoff (at 1 and 2 it repeats bulk);
#: triclinic-self-images at 1 and 4; the empty ranks at 2 and 4 (at 1 there is none). MACE
#: (each of its runs builds mace-torch's model on every rank, seconds each): every
#: structure on some rank count above 1, 4 ranks on the thin subdomains (for MACE the bulk
#: atoms: bulk on 4 ranks would repeat them on another grid, which message passing covers)
#: and on cuEquivariance's kernels below; the other 4-rank cases, which message passing
#: runs, on 2 (triclinic: split in two along its long side; empty ranks: one owns nothing)
RANKS = {
    "mpnn": {
        "bulk": NPROCS,
        "thin-subdomains": [4],
        "triclinic-self-images": [1, 4],
        "empty-ranks": [2, 4],
    },
    "mace": {
        "bulk": [1, 2],
        "thin-subdomains": [4],
        "triclinic-self-images": [1, 2],
        "empty-ranks": [2],
    },
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
    for nprocs in RANKS[name][s.id]
]
HAVE_CUEQ = HAVE_MACE and mace_module._cueq_available()
#: MACE on cuEquivariance's kernels: thin-subdomains, strategy exchange, on 1 rank and on
#: 4, where the subdomains are thinner than r_max (2 ranks: bulk's exchange)
CUEQ_RANKS = [1, 4]
#: MACE's NVE run, on 1 rank and on 2
NVE_RANKS = [1, 2]
NVE_STEPS = 200
ENERGY_EVERY = 10


def _mace_on_cuequivariance(potential):
    """The same model and weights, its file asking for cuEquivariance's kernels (on the CPU:
    cuEquivariance's pure-torch operations, mace-torch's conversion on every rank)."""
    on_cueq = type(potential).from_config({**potential.config(), "kernels": "cuequivariance"})
    on_cueq.load_state_dict(potential.state_dict())
    assert on_cueq.kernels == "cuequivariance"
    return on_cueq


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each model, built once and saved: ``built(name) -> (potential, path)``; ``mace-cueq``
    is ``mace`` on cuEquivariance's kernels."""
    cache = {}

    def build(name: str):
        if name not in cache:
            if name == "mace-cueq":
                potential = _mace_on_cuequivariance(build("mace")[0])
            else:
                potential = MODELS[name][0]()
            path = save_model(potential, tmp_path_factory.mktemp(name) / f"{name}.pt")
            cache[name] = potential, path
        return cache[name]

    return build


def comparison_script(
    label: str,
    structure: Structure,
    data: Path,
    model: Path,
    nprocs: int,
    elements,
    strategies=STRATEGIES,
) -> str:
    """``run 0`` under each strategy: a dump and a print each, named ``label-strategy``."""
    lines = [run0_header(data.name, structure.processors.get(nprocs, ""))]
    for strategy in strategies:
        lines.append(f"pair_style nvalchemi {model} strategy {strategy}\n")
        lines.append(f"pair_coeff * * {' '.join(elements)}\n")
        lines.append(run0_evaluation(f"{label}-{strategy}"))
    return "".join(lines)


def nve_script(data: Path, model: Path, energy_file: str, owner_file: str) -> str:
    """200 NVE steps (NVE_STEPS) of the bulk structure from 300 K; a small skin rebuilds the
    neighbor lists many times (18 in 200 steps), and atoms migrate between ranks."""
    script = textwrap.dedent(
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
            file {energy_file} screen no
        """
    )
    return script + OWNER_DUMP.format(every=NVE_STEPS, path=owner_file) + f"run {NVE_STEPS}\n"


def _segments(nprocs: int, built, workdir: Path) -> dict[str, str]:
    """Every LAMMPS run of this module on ``nprocs`` ranks, by segment name: each
    (model, structure) of :data:`RANKS`, MACE on cuEquivariance (:data:`CUEQ_RANKS`) and
    MACE's NVE run (:data:`NVE_RANKS`)."""

    def data_file(label, structure, masses):
        return write_lammps_data(
            workdir / f"{label}.data",
            structure.positions,
            structure.cell,
            structure.species + 1,
            masses,
        )

    scripts = {}
    for name, (_, elements, masses, structures) in MODELS.items():
        if name == "mace" and not HAVE_MACE:
            continue
        for structure in structures:
            if nprocs in RANKS[name][structure.id]:
                label = f"{name}-{structure.id}"
                data = data_file(label, structure, masses)
                path = built(name)[1]
                scripts[label] = comparison_script(label, structure, data, path, nprocs, elements)
    if HAVE_CUEQ and nprocs in CUEQ_RANKS:
        label, structure = "mace-cueq", STRUCTURES["thin-subdomains"]
        data = data_file(label, structure, MASSES)
        path = built("mace-cueq")[1]
        scripts[label] = comparison_script(
            label, structure, data, path, nprocs, ELEMENTS, strategies=("exchange",)
        )
    if HAVE_MACE and nprocs in NVE_RANKS:
        data = data_file("mace-nve", STRUCTURES["bulk"], MASSES)
        scripts["mace-nve"] = nve_script(
            data, built("mace")[1], "mace-nve.energy", "mace-nve.owner"
        )
    return scripts


@pytest.fixture(scope="module")
def runs(built, tmp_path_factory):
    """All of this module's LAMMPS runs on one rank count in one LAMMPS process (the ranks
    import torch and mace-torch once), made when a test first asks:
    ``runs(nprocs) -> (workdir, {segment name: its output})``."""
    cache = {}

    def run(nprocs: int):
        if nprocs not in cache:
            workdir = tmp_path_factory.mktemp(f"np{nprocs}")
            scripts = _segments(nprocs, built, workdir)
            outputs = run_segments(scripts, nprocs, workdir, timeout=1800)
            cache[nprocs] = workdir, outputs
        return cache[nprocs]

    return run


def _reference(potential, structure: Structure):
    return evaluate_reference(
        potential, structure.positions, structure.cell, (True, True, True), structure.species
    )


@pytest.mark.parametrize(("name", "structure", "nprocs"), CASES)
def test_message_passing_equals_reference(name, structure, nprocs, built, runs):
    potential, _ = built(name)
    ref = _reference(potential, structure)
    workdir, outputs = runs(nprocs)
    label = f"{name}-{structure.id}"
    output = outputs[label]
    if structure.id == "empty-ranks" and nprocs > 1:
        owned = atoms_per_rank(output, "Nlocal")  # (fewest, most) per run
        assert len(owned) == 2 and all(fewest == 0 for fewest, _ in owned), owned

    got = {}
    ids = np.arange(1, len(ref.forces) + 1)
    for strategy in STRATEGIES:
        atoms, glob = got[strategy] = read_evaluation(workdir, output, f"{label}-{strategy}", ids)
        assert_matches_reference(
            f"{name}/{structure.id}/{strategy}/np{nprocs}", atoms, glob, ref, structure.cell
        )

    assert_strategies_agree(
        f"{name}/{structure.id}/exchange-vs-shell/np{nprocs}", got["exchange"], got["shell"]
    )


# --- on cuEquivariance's kernels (issue 16) -------------------------------------------------


@needs_mace
@pytest.mark.skipif(not HAVE_CUEQ, reason="cuequivariance-torch is not installed")
@pytest.mark.parametrize("nprocs", CUEQ_RANKS, ids=[f"np{n}" for n in CUEQ_RANKS])
def test_mace_on_cuequivariance_equals_reference(nprocs, built, runs):
    """Subdomains thinner than the cutoff, node features exchanged between layers: the
    cuEquivariance network through LAMMPS equals the e3nn network on the whole system."""
    potential, _ = built("mace")
    structure = STRUCTURES["thin-subdomains"]
    ref = _reference(potential, structure)
    workdir, outputs = runs(nprocs)
    ids = np.arange(1, len(ref.forces) + 1)
    atoms, results = read_evaluation(workdir, outputs["mace-cueq"], "mace-cueq-exchange", ids)
    label = f"mace/cuequivariance/{structure.id}/exchange/np{nprocs}"
    assert_matches_reference(label, atoms, results, ref, structure.cell)


# --- dynamics ------------------------------------------------------------------------------


@needs_mace
def test_nve_drift_two_ranks_like_one(runs):
    """Energy conservation on 2 ranks is no worse than on 1.

    Criterion: with E(t) the total energy every 10 steps, the drift max_t |E(t) - E(0)|
    on 2 ranks is at most 1.1 x that on 1 rank plus 1e-10 |E(0)| (the static agreement),
    and the two runs' E(t) agree to the same 1e-10 |E(0)| at every step: the forces are
    the same to rounding, so the trajectories stay together and so must the energies.
    The drift itself is checked to be far larger than that tolerance, or the comparison
    would say nothing; and the run on 2 ranks to rebuild its neighbor lists at least 10
    times and to move some atom to the other rank.
    """
    energies = {}
    for nprocs in NVE_RANKS:
        workdir, outputs = runs(nprocs)
        steps, etotal, _kinetic = np.loadtxt(workdir / "mace-nve.energy", comments="#", unpack=True)
        assert steps[0] == 0 and steps[-1] == NVE_STEPS
        energies[nprocs] = etotal
        if nprocs == 2:
            builds = neighbor_list_builds(outputs["mace-nve"])
            assert len(builds) == 1 and builds[0] >= 10, builds
            assert atoms_migrated(workdir / "mace-nve.owner") > 0
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
