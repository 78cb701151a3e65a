"""``pair_style nvalchemi`` with a Lennard-Jones model against LAMMPS's own ``lj/cut``.

Each test is one LAMMPS comparison on 1, 2 or 4 ranks: ``lj/cut`` → ``run 0`` → dump, then
the same atoms under ``pair_style nvalchemi`` → ``run 0`` → dump. The systems on one rank
count are segments of one LAMMPS process, ``clear`` between them (the ranks start once). Compared per atom by ID:
forces, per-atom energy (``compute pe/atom``), per-atom virial stress (``compute
stress/atom``); globally: total energy and the pressure tensor (thermo's, and its virial part
alone). Every quantity must agree to 1e-10 relative (``max|a-b| / max|ref|``).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from lammps_helpers import (
    AR_EPSILON,
    AR_EPSILON_REAL,
    AR_MASS,
    AR_NE_CUTOFF,
    AR_NE_EPSILON,
    AR_NE_SIGMA,
    AR_SIGMA,
    ARGON_ATOMS,
    ARGON_NEON_LJ_CUT,
    CUTOFF,
    GLOBAL,
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
    dump_commands,
    print_results,
    run_segments,
)

from nvalchemi_lammps.lammps_run import read_dump, read_results, run_lammps

pytestmark = pytest.mark.lammps


@dataclass(frozen=True)
class System:
    """One system, set up from the thermalized argon data file, and its lj/cut equivalent.

    :param id: test id
    :param model: key of the ``models`` fixture
    :param elements: ``pair_coeff * *`` element names, one per LAMMPS type
    :param reference: ``lj/cut`` commands giving the same interactions
    :param setup: commands after ``read_data``
    :param read_data: extra ``read_data`` keywords
    :param processors: ``processors`` grid (``{nprocs}`` is filled in)
    :param units: LAMMPS unit style
    :param plugin: commands that switch to the plugin (``{model}`` is filled in); by
        default ``pair_style nvalchemi`` and ``pair_coeff * *`` with ``elements``
    """

    id: str
    model: str
    elements: str
    reference: str
    setup: str = ""
    read_data: str = ""
    processors: str = ""
    units: str = "metal"
    plugin: str = ""

    def plugin_commands(self, model: Path) -> str:
        if self.plugin:
            return textwrap.dedent(self.plugin).format(model=model)
        return f"pair_style nvalchemi {model}\npair_coeff * * {self.elements}\n"


ARGON_LJ_CUT = f"""
pair_style lj/cut {CUTOFF}
pair_coeff 1 1 {AR_EPSILON} {AR_SIGMA}
"""

#: 30 % of the argon atoms become type 2 (``set`` seeds its generator by position, so the
#: choice does not depend on the decomposition).
NEON_TYPE_2 = f"""
mass 2 {NE_MASS}
set type 1 type/fraction 2 0.3 8675309
"""

SYSTEMS = [
    System("orthogonal", "argon", "Ar", ARGON_LJ_CUT),
    System(
        "triclinic",
        "argon",
        "Ar",
        ARGON_LJ_CUT,
        setup="""
        change_box all triclinic
        change_box all xy final 4.0 xz final -3.0 yz final 2.5 remap units box
        """,
    ),
    System("nonperiodic_z", "argon", "Ar", ARGON_LJ_CUT, setup="change_box all boundary p p s"),
    System(
        "shifted",
        "argon_shifted",
        "Ar",
        ARGON_LJ_CUT + "pair_modify shift yes\n",
    ),
    System(
        "real_units",
        "argon_real",
        "Ar",
        f"""
        pair_style lj/cut {CUTOFF}
        pair_coeff 1 1 {AR_EPSILON_REAL} {AR_SIGMA}
        """,
        # the data file's velocities are in metal units: draw new ones
        setup="velocity all create 60 4928459 loop geom",
        units="real",
    ),
    # The box doubled along z with every atom in its lower half, split along z only: at 2
    # ranks one rank owns no atom; at 4 ranks two own none and the top one has no ghost
    # either. Not an error: every rank takes the same path and the result still matches.
    System(
        "empty_ranks",
        "argon",
        "Ar",
        ARGON_LJ_CUT,
        setup="change_box all z final 0 84.16 boundary p p f",
        processors="processors 1 1 {nprocs}",
    ),
    System(
        "two_species",
        "argon_neon",
        "Ar Ne",
        ARGON_NEON_LJ_CUT,
        setup=NEON_TYPE_2,
        read_data="extra/atom/types 1",
    ),
    # Types 1 and 3 are both argon.
    System(
        "two_types_one_element",
        "argon_neon",
        "Ar Ne Ar",
        f"""
        pair_style lj/cut {CUTOFF}
        pair_coeff 1*3 1*3 {AR_EPSILON} {AR_SIGMA}
        pair_coeff 2 2 {NE_EPSILON} {NE_SIGMA} {NE_NE_CUTOFF}
        pair_coeff 1 2 {AR_NE_EPSILON} {AR_NE_SIGMA} {AR_NE_CUTOFF}
        pair_coeff 2 3 {AR_NE_EPSILON} {AR_NE_SIGMA} {AR_NE_CUTOFF}
        """,
        setup=NEON_TYPE_2
        + f"""
        mass 3 {AR_MASS}
        set type 1 type/fraction 3 0.5 1234567
        """,
        read_data="extra/atom/types 2",
    ),
    System(
        "arithmetic_mixing",
        "argon_neon_arithmetic",
        "Ar Ne",
        f"""
        pair_style lj/cut {CUTOFF}
        pair_modify mix arithmetic
        pair_coeff 1 1 {AR_EPSILON} {AR_SIGMA}
        pair_coeff 2 2 {NE_EPSILON} {NE_SIGMA}
        """,
        setup=NEON_TYPE_2,
        read_data="extra/atom/types 1",
    ),
    # NULL: the model handles Ar-Ar only; lj/cut, the other half of a hybrid, does the rest.
    System(
        "null_type_hybrid",
        "argon",
        "Ar NULL",
        ARGON_NEON_LJ_CUT,
        setup=NEON_TYPE_2,
        read_data="extra/atom/types 1",
        plugin=f"""
        pair_style hybrid nvalchemi {{model}} lj/cut {CUTOFF}
        pair_coeff * * nvalchemi Ar NULL
        pair_coeff 2 2 lj/cut {NE_EPSILON} {NE_SIGMA} {NE_NE_CUTOFF}
        pair_coeff 1 2 lj/cut {AR_NE_EPSILON} {AR_NE_SIGMA} {AR_NE_CUTOFF}
        """,
    ),
]

#: Global results: printed name -> thermo expression.
GLOBAL_EXPRESSIONS = {
    "pe": "pe",
    **{p: p for p in PRESSURE},
    **{f"vir_{p}": f"c_virial[{k}]" for k, p in enumerate(PRESSURE, start=1)},
}
PER_ATOM_COLUMNS = [c for columns in PER_ATOM.values() for c in columns]


def comparison_script(
    system: System, data: Path, model: Path, nprocs: int, prefix: str = ""
) -> str:
    """lj/cut, then the plugin, on the same atoms in one run; a dump and a print each (the
    dumps ``PREFIXreference.dump`` and ``PREFIXplugin.dump``)."""
    block = textwrap.dedent
    virial = " ".join(f"c_virial[{k}]" for k in range(1, 7))
    return "".join(
        [
            block(
                f"""\
                units {system.units}
                atom_style atomic
                {system.processors.format(nprocs=nprocs)}
                read_data {data} {system.read_data}
                """
            ),
            block(system.setup),
            block(
                f"""
                compute pe all pe/atom
                compute stress all stress/atom NULL virial
                compute virial all pressure NULL virial
                thermo_style custom step pe press {" ".join(PRESSURE)} {virial}
                """
            ),
            block(system.reference),
            dump_commands("reference", f"{prefix}reference.dump", PER_ATOM_COLUMNS),
            "run 0\nundump reference\n",
            print_results("REFERENCE", GLOBAL_EXPRESSIONS),
            system.plugin_commands(model),
            dump_commands("plugin", f"{prefix}plugin.dump", PER_ATOM_COLUMNS),
            "run 0\nundump plugin\n",
            print_results("PLUGIN", GLOBAL_EXPRESSIONS),
        ]
    )


def _plugin_list(output: str) -> str:
    """The attributes of the neighbor list LAMMPS built for the plugin (``half, newton on``
    or ``full, newton on``), from its neighbor-list summary."""
    lines = output.splitlines()
    for k, line in enumerate(lines):
        if "pair nvalchemi, perpetual" in line:
            return lines[k + 1].strip()
    raise AssertionError("no neighbor list of pair nvalchemi in the output")


def _compare(system: System, nprocs: int, output: str, workdir: Path, prefix: str = "") -> None:
    """The plugin's dump and thermo against lj/cut's (:func:`comparison_script`'s, ``output``
    its screen output), per atom by ID and globally."""
    ref = read_dump(workdir / f"{prefix}reference.dump")
    got = read_dump(workdir / f"{prefix}plugin.dump")
    assert_same_atoms(got, ref, ARGON_ATOMS)
    ref_global = read_results(output, "REFERENCE")
    got_global = read_results(output, "PLUGIN")

    def stack(table, names):
        return np.stack([table[n] for n in names], axis=-1)

    pairs = {q: (stack(got, cols), stack(ref, cols)) for q, cols in PER_ATOM.items()}
    for quantity, names in GLOBAL.items():
        pairs[quantity] = (stack(got_global, names), stack(ref_global, names))
    assert_all_close(f"{system.id}/np{nprocs}", pairs)


#: ranks per system: orthogonal at 1, 2 and 4; empty_ranks at 2 and 4 (one rank without
#: atoms, then two, one without ghosts); each other system at 1 and 4, where its 2-rank
#: case would repeat the 4-rank one's ghost exchange with fewer neighbors
RANKS = {"orthogonal": NPROCS, "empty_ranks": [2, 4]}
CASES = [
    pytest.param(system, nprocs, id=f"{system.id}-np{nprocs}")
    for system in SYSTEMS
    for nprocs in RANKS.get(system.id, [1, 4])
]


@pytest.fixture(scope="module")
def runs(argon_data, models, tmp_path_factory):
    """Every system of :data:`CASES` on one rank count in one LAMMPS process, ``clear``
    between them (the ranks start and import torch once), made when a test first asks:
    ``runs(nprocs) -> (workdir, {system id: its output})``; system ``S`` dumps
    ``S-reference.dump`` and ``S-plugin.dump``."""
    cache = {}

    def run(nprocs: int):
        if nprocs not in cache:
            workdir = tmp_path_factory.mktemp(f"np{nprocs}")
            scripts = {
                s.id: comparison_script(s, argon_data, models[s.model], nprocs, f"{s.id}-")
                for s in SYSTEMS
                if nprocs in RANKS.get(s.id, [1, 4])
            }
            outputs = run_segments(scripts, nprocs, workdir, timeout=1200)
            cache[nprocs] = workdir, outputs
        return cache[nprocs]

    return run


@pytest.mark.parametrize(("system", "nprocs"), CASES)
def test_plugin_matches_lj_cut(system, nprocs, runs):
    workdir, outputs = runs(nprocs)
    output = outputs[system.id]
    # symmetric pair terms: lj/cut's half list, each pair once, ghost energies folded
    assert _plugin_list(output).startswith("attributes: half")
    _compare(system, nprocs, output, workdir, f"{system.id}-")

    if system.processors and nprocs > 1:
        # the plugin's run (the last summary) really had a rank without atoms
        assert atoms_per_rank(output, "Nlocal")[-1][0] == 0
        if nprocs == 4:
            assert atoms_per_rank(output, "Nghost")[-1][0] == 0


@pytest.mark.parametrize("nprocs", [1, 4], ids=lambda n: f"np{n}")
def test_directed_pair_scalars_match_lj_cut(nprocs, argon_data, tmp_path):
    """A pair potential with a closed form not declared symmetric gets every directed pair
    (a full list) and gives one force scalar per pair, which the pair style multiplies by
    rij: as exact as the half list. Triclinic, so that no component of rij is special."""
    from _broken_models import DirectedPairsLennardJones, importable_in_lammps

    from nvalchemi_lammps import save_model

    model = save_model(
        DirectedPairsLennardJones(
            elements=["Ar"], epsilon={"Ar": AR_EPSILON}, sigma={"Ar": AR_SIGMA}, cutoff=CUTOFF
        ),
        tmp_path / "directed.pt",
    )
    system = next(s for s in SYSTEMS if s.id == "triclinic")
    script = comparison_script(system, argon_data, model, nprocs)
    env = {"PYTHONPATH": importable_in_lammps(tmp_path / "site")}
    run = run_lammps(script, nprocs, tmp_path, timeout=600, env=env).check()
    assert _plugin_list(run.output).startswith("attributes: full")
    _compare(system, nprocs, run.output, tmp_path)
