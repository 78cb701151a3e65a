"""UMA's released architecture (a mixture of linear experts, read from a fairchem checkpoint
file) through ``pair_style nvalchemi`` on 1, 2 and 4 ranks, against fairchem's own predict
unit on the whole periodic system (and, for per-atom energies and virials, which the
predict unit does not give, against the same model without LAMMPS, ``reference.py``).

The checkpoint is a small random one (``_uma_models.write_moe_checkpoint``: 4 experts, a head
expert per dataset, normalizers and element references per dataset), written as fairchem
writes one and exported with ``nvalchemi-lammps export``. One LAMMPS run per rank count
evaluates, on 16 atoms of H, C, O, Cu with vacuum along z (4 ranks: two own nothing):

- ``run 0`` for task omat, omol (charge -1, spin 2) and oc20 in float64, and omat in
  float32: energy and forces by atom ID equal the predict unit's to 1e-10 (float32: 1e-5),
  per-atom energies, pressure and per-atom virials the model's without LAMMPS;
- 60 NVT steps at 5000 K with frequent neighbor list builds: atoms move between ranks, so
  each rank's own composition changes while the system's does not; at the last step the
  forces and energy equal the predict unit's on the dumped positions;
- then ``delete_atoms`` (as ``fix evaporate`` does) and ``run 0``: the experts are mixed for
  the new composition, equal to the predict unit on the smaller system.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
from _uma_models import ELEMENTS, copper_oxide_slab, fairchem_predict, predict_unit
from lammps_helpers import (
    NPROCS,
    PER_ATOM,
    PER_ATOM_COLUMNS,
    SPLIT_XZ,
    TOLERANCE,
    assert_all_close,
    assert_matches_reference,
    assert_ranks_own,
    atoms_per_rank,
    per_atom,
    read_evaluation,
    run0_evaluation,
    run0_header,
)

from nvalchemi_lammps import load_model, save_model
from nvalchemi_lammps.cli import main
from nvalchemi_lammps.lammps_run import read_dump, run_lammps, write_lammps_data
from nvalchemi_lammps.potentials.uma import Uma
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = [pytest.mark.lammps, pytest.mark.uma]

MASSES = [1.008, 12.011, 15.999, 63.546]
SYSTEM = copper_oxide_slab()
#: (name, model, net charge, pair style keywords) of each ``run 0``.
CASES = [
    ("omat", "float64", 0, {}),
    ("omol_anion", "float64", -1, {"spin": 2, "task": "omol"}),
    ("oc20", "float64", 0, {"task": "oc20"}),
    ("f32_omat", "float32", 0, {}),
]
#: float32 through LAMMPS against fairchem's float32 predict unit: the same float32
#: operations in another order (as in test_charged_mlips.py).
FLOAT32_TOLERANCE = 1e-5
NVT_STEPS, NVT_EVERY = 60, 20
#: Atom IDs deleted after the NVT run: one Cu, one O (the composition changes).
GONE = (2, 11)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The checkpoint, its float64 export (through the CLI) and float32 one, and fairchem's
    predict units in both precisions."""
    from _uma_models import write_moe_checkpoint

    workdir = tmp_path_factory.mktemp("uma_moe")
    checkpoint = write_moe_checkpoint(workdir / "checkpoint.pt", seed=0, head="experts")
    config = workdir / "uma.toml"
    config.write_text(
        f'potential = "uma"\ncheckpoint = "{checkpoint}"\ntask = "omat"\n'
        f'elements = {list(ELEMENTS)!r}\ndtype = "float64"\n'.replace("'", '"')
    )
    paths = {"float64": workdir / "uma64.pt", "float32": workdir / "uma32.pt"}
    assert main(["export", str(config), "-o", str(paths["float64"])]) == 0
    save_model(
        Uma.from_checkpoint(checkpoint, "omat", list(ELEMENTS), dtype="float32"), paths["float32"]
    )
    units = {"float64": predict_unit(checkpoint), "float32": predict_unit(checkpoint, "float32")}
    return paths, units


def script(data: Path, paths: dict[str, Path], nprocs: int) -> str:
    columns = ["x", "y", "z", *PER_ATOM_COLUMNS]
    lines = [run0_header(data.name, SPLIT_XZ[nprocs])]
    for name, model, charge, options in CASES:
        keywords = "".join(f" {k} {v}" for k, v in options.items())
        lines.append(f"pair_style nvalchemi {paths[model]} charge {charge}{keywords}\n")
        lines.append(f"pair_coeff * * {' '.join(ELEMENTS)}\n")
        lines.append(run0_evaluation(name, columns))
    lines.append(
        textwrap.dedent(
            f"""
            pair_style nvalchemi {paths["float64"]}
            pair_coeff * * {" ".join(ELEMENTS)}
            velocity all create 5000 4928459 loop geom
            neighbor 0.2 bin
            neigh_modify every 1 delay 0 check yes
            timestep 0.001
            fix nvt all nvt temp 5000 5000 0.05
            dump trajectory all custom {NVT_EVERY} nvt_*.dump id proc x y z fx fy fz
            dump_modify trajectory sort id format float "%.17g"
            fix energy all print {NVT_EVERY} "NVT $(step) $(pe:%.17g)"
            run {NVT_STEPS}
            undump trajectory
            unfix nvt
            unfix energy
            group gone id {" ".join(map(str, GONE))}
            delete_atoms group gone compress no
            """
        )
    )
    lines.append(run0_evaluation("evaporated", columns))
    return "".join(lines)


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory):
    """{nprocs: (workdir, LAMMPS output)}."""
    paths, _ = models
    results = {}
    for nprocs in NPROCS:
        workdir = tmp_path_factory.mktemp(f"moe_np{nprocs}")
        data = write_lammps_data(
            workdir / "system.data", SYSTEM.positions, SYSTEM.cell, SYSTEM.species + 1, MASSES
        )
        run = run_lammps(script(data, paths, nprocs), nprocs, workdir, timeout=600)
        run.check()
        results[nprocs] = (workdir, run.output)
    return results


def _system(atoms: dict, ids: np.ndarray):
    """SYSTEM with the dumped positions of the atoms ``ids`` (atom ID k = row k - 1)."""
    from _systems import System

    positions = per_atom(atoms, ["x", "y", "z"])
    species = SYSTEM.species[ids.astype(int) - 1]
    return System("dumped", positions, SYSTEM.cell, SYSTEM.pbc, species, ELEMENTS)


def _against_predict_unit(label, atoms, energy, unit, task, charge, spin, tol):
    system = _system(atoms, atoms["id"])
    theirs = fairchem_predict(unit, system, task, charge, spin)
    assert_all_close(
        f"{label}/vs-predict-unit",
        {
            "energy": (np.array([energy]), np.array([theirs["energy"]])),
            "force": (per_atom(atoms, PER_ATOM["force"]), theirs["forces"]),
        },
        tol=tol,
    )
    return system


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_uma_moe_equals_predict_unit(models, runs, nprocs):
    paths, units = models
    workdir, output = runs[nprocs]
    owned = atoms_per_rank(output, "Nlocal")[: len(CASES)]  # (fewest, most) per run 0
    assert_ranks_own(owned, nprocs)
    for name, model, charge, options in CASES:
        ids = np.arange(1, SYSTEM.natoms + 1)
        atoms, results = read_evaluation(workdir, output, name, ids)
        spin, task = options.get("spin", 0), options.get("task", "omat")
        tol = FLOAT32_TOLERANCE if model == "float32" else TOLERANCE
        label = f"uma-moe/{name}/np{nprocs}"
        _against_predict_unit(label, atoms, results["pe"], units[model], task, charge, spin, tol)
        ours = load_model(paths[model])
        ref = evaluate_reference(
            ours,
            SYSTEM.positions,
            SYSTEM.cell,
            SYSTEM.pbc,
            SYSTEM.species,
            total_charge=float(charge),
            **options,
        )
        assert_matches_reference(label, atoms, results, ref, SYSTEM.cell, tol=tol)


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_uma_moe_nvt_and_evaporation(models, runs, nprocs):
    """After NVT steps in which atoms change ranks, and after atoms are deleted, LAMMPS's
    energy and forces are the predict unit's on the dumped positions."""
    _, units = models
    workdir, output = runs[nprocs]
    frames = [
        read_dump(workdir / f"nvt_{step}.dump") for step in range(0, NVT_STEPS + 1, NVT_EVERY)
    ]
    if nprocs > 1:  # atoms migrated between ranks during the run
        owners = np.stack([frame["proc"] for frame in frames])
        assert (owners != owners[0]).any(), "no atom changed rank: nothing tested"
    moved = np.abs(per_atom(frames[-1], ["x", "y", "z"]) - SYSTEM.positions).max()
    assert moved > 0.1, moved
    energies = {
        int(s): float(e)
        for s, e in (line.split()[1:3] for line in output.splitlines() if line.startswith("NVT "))
    }
    label = f"uma-moe/nvt/np{nprocs}"
    _against_predict_unit(
        label, frames[-1], energies[NVT_STEPS], units["float64"], "omat", 0, 0, TOLERANCE
    )

    kept = [k for k in range(1, SYSTEM.natoms + 1) if k not in GONE]
    atoms, results = read_evaluation(workdir, output, "evaporated", kept)
    pe = results["pe"]
    label = f"uma-moe/evaporated/np{nprocs}"
    _against_predict_unit(label, atoms, pe, units["float64"], "omat", 0, 0, TOLERANCE)


@pytest.mark.parametrize(
    ("pair_commands", "message"),
    [
        (
            "pair_style nvalchemi {model} task odac\npair_coeff * * H C O Cu",
            "unknown UMA task 'odac' (this model's tasks: oc20, omat, omol)",
        ),
        (
            "pair_style nvalchemi {model}\npair_coeff * * H C O Fe",
            "element Fe not in model (H, C, O, Cu)",
        ),
    ],
    ids=["task", "element"],
)
def test_uma_moe_bad_input(models, tmp_path, pair_commands, message):
    """A task the checkpoint has no head and normalization for, or an element the model was
    not exported for: a LAMMPS error on both ranks naming it, no hang."""
    paths, _ = models
    data = write_lammps_data(
        tmp_path / "system.data", SYSTEM.positions, SYSTEM.cell, SYSTEM.species + 1, MASSES
    )
    lines = ["units metal", "atom_style atomic", "processors 2 1 1", f"read_data {data.name}"]
    lines += [pair_commands.format(model=paths["float64"]), "run 0"]
    run = run_lammps("\n".join(lines) + "\n", 2, tmp_path, timeout=300)
    assert run.returncode not in (0, -9), run.output[-3000:]
    errors = "\n".join(line for line in run.output.splitlines() if "ERROR" in line)
    assert message in errors, run.output[-3000:]
