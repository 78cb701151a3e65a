"""``toolkit_lennard_jones`` (nvalchemiops's Warp kernel) through ``pair_style nvalchemi``
on 1, 2 and 4 ranks, against LAMMPS's ``lj/cut`` and the keystone ``lennard_jones``.

One LAMMPS run per rank count: ``lj/cut`` → ``run 0``, the keystone model → ``run 0``, the
toolkit model → ``run 0``. Compared per atom by atom ID (forces, per-atom energies and
virials) and globally (energy, pressure): the toolkit model equals both to 1e-10 relative.

An Ar/Ne fcc crystal (explicit Ar-Ne pair with its own cutoff, shifted energies) fills the
lower half of a box split along z (and along x on 4 ranks): on 2 and 4 ranks the upper
ranks own no atom.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from lammps_helpers import (
    AR_EPSILON,
    AR_MASS,
    AR_NE_CUTOFF,
    AR_NE_EPSILON,
    AR_NE_SIGMA,
    AR_SIGMA,
    ARGON_NEON_LJ_CUT,
    CUTOFF,
    NE_EPSILON,
    NE_MASS,
    NE_NE_CUTOFF,
    NE_SIGMA,
    NPROCS,
    PER_ATOM,
    PRESSURE,
    assert_all_close,
    assert_same_atoms,
    atoms_per_rank,
    per_atom,
    print_results,
)

from nvalchemi_lammps import save_model
from nvalchemi_lammps.lammps_run import read_dump, read_results, run_lammps, write_lammps_data
from nvalchemi_lammps.potentials.lennard_jones import LennardJones
from nvalchemi_lammps.potentials.toolkit_lennard_jones import ToolkitLennardJones
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.lammps

ARGUMENTS = {
    "elements": ["Ar", "Ne"],
    "epsilon": {"Ar": AR_EPSILON, "Ne": NE_EPSILON},
    "sigma": {"Ar": AR_SIGMA, "Ne": NE_SIGMA},
    "cutoff": CUTOFF,
    "pairs": [
        {"elements": ["Ar", "Ne"], "epsilon": AR_NE_EPSILON, "sigma": AR_NE_SIGMA},
        {"elements": ["Ar", "Ne"], "cutoff": AR_NE_CUTOFF},
        {"elements": ["Ne", "Ne"], "cutoff": NE_NE_CUTOFF},
    ],
    "shift": True,
}
LJ_CUT = ARGON_NEON_LJ_CUT + "pair_modify shift yes\n"
PROCESSORS = {1: "", 2: "processors 1 1 2", 4: "processors 2 1 2"}
COLUMNS = [c for columns in PER_ATOM.values() for c in columns]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    rng = np.random.default_rng(11)
    fcc = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
    cells = np.stack(np.meshgrid(*[np.arange(4.0)] * 3, indexing="ij"), -1).reshape(-1, 3)
    positions = 5.26 * (cells[:, None] + fcc[None]).reshape(-1, 3) + 0.5
    positions += rng.normal(0.0, 0.1, positions.shape)
    species = (rng.random(len(positions)) < 0.3).astype(np.int64)  # 0 = Ar, 1 = Ne
    cell = np.diag([21.04, 21.04, 2 * 21.04 + 1.0])
    workdir = tmp_path_factory.mktemp("toolkit_lj")
    data = write_lammps_data(
        workdir / "arne.data", positions, cell, species + 1, [AR_MASS, NE_MASS]
    )
    toolkit = ToolkitLennardJones(**ARGUMENTS)
    # also compiles the Warp kernel here, once, before several ranks would at the same time
    evaluate_reference(toolkit, positions, cell, (True, True, True), species)
    models = {
        "keystone": save_model(LennardJones(**ARGUMENTS), workdir / "keystone.pt"),
        "toolkit": save_model(toolkit, workdir / "toolkit.pt"),
    }
    return data, models, len(positions)


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_toolkit_lj_equals_lj_cut_and_keystone(setup, nprocs, tmp_path):
    data, models, natoms = setup
    stress = " ".join(f"c_stress[{k}]" for k in range(1, 7))
    script = textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        {PROCESSORS[nprocs]}
        read_data {data}
        compute pe all pe/atom
        compute stress all stress/atom NULL virial
        thermo_style custom step pe {" ".join(PRESSURE)}
        """
    )
    runs = {
        "lj_cut": LJ_CUT,
        **{k: f"pair_style nvalchemi {m}\npair_coeff * * Ar Ne\n" for k, m in models.items()},
    }
    for name, commands in runs.items():
        script += commands + textwrap.dedent(
            f"""\
            dump {name} all custom 1 {name}.dump id fx fy fz c_pe {stress}
            dump_modify {name} sort id format float "%.17g"
            run 0
            undump {name}
            """
        )
        script += print_results(name.upper(), {"pe": "pe", **{p: p for p in PRESSURE}})
    run = run_lammps(script, nprocs, tmp_path, timeout=600).check()
    if nprocs > 1:
        owned = atoms_per_rank(run.output, "Nlocal")
        assert len(owned) == 3 and all(lo == 0 for lo, _ in owned), owned

    got = read_dump(tmp_path / "toolkit.dump")
    got_global = read_results(run.output, "TOOLKIT")
    for reference in ("lj_cut", "keystone"):
        ref = read_dump(tmp_path / f"{reference}.dump")
        ref_global = read_results(run.output, reference.upper())
        assert_same_atoms(got, ref, natoms)
        assert_all_close(
            f"toolkit-lj/vs-{reference}/np{nprocs}",
            {
                "energy": (np.array([got_global["pe"]]), np.array([ref_global["pe"]])),
                **{q: (per_atom(got, c), per_atom(ref, c)) for q, c in PER_ATOM.items()},
                "pressure": (
                    np.array([got_global[p] for p in PRESSURE]),
                    np.array([ref_global[p] for p in PRESSURE]),
                ),
            },
        )
