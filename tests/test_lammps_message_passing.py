"""A message-passing potential through ``pair_style nvalchemi`` on 1, 2 and 4 ranks against
the same potential on the whole periodic system without LAMMPS (``reference.py``).

Both strategies are run: ``exchange`` (ghost features refreshed through LAMMPS's own
communication after each layer, ghost shell of one cutoff) and ``shell`` (ghost shell of
``layers x cutoff``, no exchange). Each must equal the reference to 1e-10 relative, and the
two strategies each other to 1e-12.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from lammps_helpers import (
    NPROCS,
    PRESSURE,
    assert_matches_reference,
    assert_strategies_agree,
    atoms_per_rank,
    print_results,
)

from nvalchemi_lammps import MessagePassing, save_model
from nvalchemi_lammps.lammps_run import read_dump, read_results, run_lammps, write_lammps_data
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.lammps

ELEMENTS = ["Ar", "Ne"]
MASSES = [39.948, 20.1797]
CUTOFF = 5.0
LAYERS = 3
FCC = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])


@dataclass(frozen=True)
class Structure:
    id: str
    positions: np.ndarray
    cell: np.ndarray
    species: np.ndarray  # model element index; LAMMPS type = species + 1
    processors: dict[int, str]  # extra `processors` grid per rank count


def _fcc(cells: tuple[int, int, int], a: float, seed: int, cell_shape=None) -> tuple:
    rng = np.random.default_rng(seed)
    grid = np.array(
        [[i, j, k] for i in range(cells[0]) for j in range(cells[1]) for k in range(cells[2])],
        dtype=np.float64,
    )
    frac = (grid[:, None, :] + FCC[None, :, :]).reshape(-1, 3) / np.array(cells)
    cell = np.diag(np.array(cells, dtype=np.float64) * a) if cell_shape is None else cell_shape
    positions = frac @ cell + rng.normal(0.0, 0.12, size=frac.shape)
    species = (rng.random(len(frac)) < 0.35).astype(np.int64)
    return positions, cell, species


def _structures() -> list[Structure]:
    bulk = _fcc((4, 4, 4), 4.1, seed=1)
    # 4 ranks along x: each subdomain is 4.1 Angstrom thick, thinner than the cutoff
    thin = _fcc((4, 2, 2), 4.1, seed=2)
    # a skewed cell smaller than the cutoff: atoms see their own periodic images
    tric_cell = np.array([[6.0, 0.0, 0.0], [1.7, 5.6, 0.0], [-1.1, 1.3, 5.9]])
    tric = _fcc((1, 1, 1), 1.0, seed=3, cell_shape=tric_cell)
    # atoms fill the lower 40% of z only: with 4 ranks along z two ranks own nothing
    slab_pos, slab_cell, slab_species = _fcc((3, 3, 2), 4.1, seed=4)
    slab_cell = slab_cell.copy()
    slab_cell[2, 2] = 2.5 * slab_cell[2, 2]
    slab_pos = slab_pos + np.array([0.0, 0.0, 1.0])  # none wraps to the top of the box
    return [
        Structure("bulk", *bulk, processors={}),
        Structure("thin-subdomains", *thin, processors={4: "processors 4 1 1"}),
        Structure("triclinic-self-images", *tric, processors={}),
        Structure(
            "empty-ranks",
            slab_pos,
            slab_cell,
            slab_species,
            processors={2: "processors 1 1 2", 4: "processors 1 1 4"},
        ),
    ]


STRUCTURES = {s.id: s for s in _structures()}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[MessagePassing, Path]:
    potential = MessagePassing(ELEMENTS, cutoff=CUTOFF, layers=LAYERS, features=12, seed=7)
    path = save_model(potential, tmp_path_factory.mktemp("mp") / "mp.pt")
    return potential, path


def _run(structure: Structure, model_path: Path, nprocs: int, strategy: str, workdir: Path):
    workdir.mkdir(parents=True, exist_ok=True)
    data = write_lammps_data(
        workdir / "system.data", structure.positions, structure.cell, structure.species + 1, MASSES
    )
    script = textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        atom_modify map array
        {structure.processors.get(nprocs, "")}
        read_data {data.name}
        pair_style nvalchemi {model_path} strategy {strategy}
        pair_coeff * * {" ".join(ELEMENTS)}
        compute pe all pe/atom
        compute stress all stress/atom NULL virial
        thermo_style custom step pe {" ".join(PRESSURE)}
        dump d all custom 1 atoms.dump id fx fy fz c_pe {" ".join(f"c_stress[{k}]" for k in range(1, 7))}
        dump_modify d sort id format float "%.17g"
        run 0
        """
    ) + print_results("RESULT", {"pe": "pe", **{p: p for p in PRESSURE}})
    run = run_lammps(script, nprocs, workdir, timeout=600).check()
    return read_dump(workdir / "atoms.dump"), read_results(run.output), run.output


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
@pytest.mark.parametrize("structure", STRUCTURES.values(), ids=STRUCTURES.keys())
def test_message_passing_equals_reference(structure, nprocs, model, tmp_path):
    potential, path = model
    ref = evaluate_reference(
        potential, structure.positions, structure.cell, (True, True, True), structure.species
    )

    results = {}
    for strategy in ("exchange", "shell"):
        atoms, glob, output = _run(structure, path, nprocs, strategy, tmp_path / strategy)
        if structure.id == "empty-ranks" and nprocs > 1:
            owned = atoms_per_rank(output, "Nlocal")
            assert owned and owned[-1][0] == 0, f"no rank was left without atoms: {owned}"
        results[strategy] = (atoms, glob)
        label = f"mpnn/{structure.id}/{strategy}/np{nprocs}"
        assert_matches_reference(label, atoms, glob, ref, structure.cell)

    assert_strategies_agree(
        f"mpnn/{structure.id}/exchange-vs-shell/np{nprocs}", results["exchange"], results["shell"]
    )
