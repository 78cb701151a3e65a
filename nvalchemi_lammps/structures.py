"""Crystal structures (``--lattice``), element masses, and what a LAMMPS data file says of
itself, for the CLI, the tests and the benchmarks (data files are written by
:func:`~nvalchemi_lammps.lammps_run.write_lammps_data`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Random displacement of lattice atoms, as a fraction of the lattice constant.
DISPLACEMENT = 0.03

#: Fractional positions of the atoms of one conventional cubic cell.
LATTICES = {
    "sc": [[0.0, 0.0, 0.0]],
    "bcc": [[0.0, 0.0, 0.0], [0.5, 0.5, 0.5]],
    "fcc": [[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]],
    "diamond": [
        [0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0],
        [0.5, 0.0, 0.5],
        [0.0, 0.5, 0.5],
        [0.25, 0.25, 0.25],
        [0.75, 0.75, 0.25],
        [0.75, 0.25, 0.75],
        [0.25, 0.75, 0.75],
    ],
}


@dataclass(frozen=True)
class Lattice:
    """``KIND:A:NXxNYxNZ`` of ``--lattice``."""

    kind: str
    constant: float
    cells: tuple[int, int, int]

    def __str__(self) -> str:
        return f"{self.kind} {self.constant:g} A, {'x'.join(map(str, self.cells))} cells"


def parse_lattice(text: str) -> Lattice:
    """``fcc:4.05:10x10x10`` (or ``fcc:4.05:10`` for 10x10x10) -> :class:`Lattice`.

    :raises ValueError: naming what is wrong and what is allowed
    """
    form = f"--lattice takes KIND:A:NXxNYxNZ (e.g. fcc:4.05:6x6x6), got '{text}'"
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(form)
    kind, constant, cells = parts
    if kind not in LATTICES:
        raise ValueError(f"lattice kind must be one of {', '.join(LATTICES)}; got '{kind}'")
    try:
        a = float(constant)
        counts = [int(n) for n in cells.lower().split("x")]
    except ValueError:
        raise ValueError(form) from None
    if len(counts) == 1:
        counts *= 3
    if not a > 0.0 or len(counts) != 3 or min(counts) < 1:
        raise ValueError(form)
    return Lattice(kind, a, (counts[0], counts[1], counts[2]))


def build_lattice(
    lattice: Lattice, ntypes: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions (wrapped into the box), cell and LAMMPS types of a displaced crystal.

    Every atom moves by a normal random vector of ``DISPLACEMENT`` x the lattice constant
    per component (so that forces are not zero) and gets one of ``ntypes`` types at random;
    both are seeded.
    """
    rng = np.random.default_rng(seed)
    cells = np.array(lattice.cells)
    grid = np.stack(np.meshgrid(*(np.arange(n) for n in cells), indexing="ij"), -1)
    basis = np.array(LATTICES[lattice.kind])
    frac = (grid.reshape(-1, 1, 3) + basis[None]).reshape(-1, 3) / cells
    cell = np.diag(cells * lattice.constant).astype(np.float64)
    frac = frac + rng.normal(0.0, DISPLACEMENT, size=frac.shape) / cells
    positions = (frac % 1.0) @ cell
    types = rng.integers(1, ntypes + 1, size=len(frac))
    return positions, cell, types


#: Columns of an Atoms row (after the ID) by atom style: where the type and x are.
_ATOM_COLUMNS = {
    "atomic": (1, 2),
    "charge": (1, 3),
    "bond": (2, 3),
    "angle": (2, 3),
    "molecular": (2, 3),
    "full": (2, 4),
}


def read_data_atoms(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions (by atom ID, from the box origin, wrapped into the box), cell and types of
    a LAMMPS data file of atom style atomic, charge, bond, angle, molecular or full (as its
    ``Atoms # style`` comment says; atomic when it says none).

    :raises ValueError: another atom style, or a file without atoms, box or Atoms section
    """
    style = read_data_header(path).atom_style
    if style not in _ATOM_COLUMNS:
        raise ValueError(
            f"data file {path}: atom style {style} is not read here "
            f"(one of {', '.join(_ATOM_COLUMNS)})"
        )
    type_column, x_column = _ATOM_COLUMNS[style]
    lines = Path(path).read_text().splitlines()
    natoms, bounds, tilt = None, {}, (0.0, 0.0, 0.0)
    start = None
    for k, line in enumerate(lines[1:], start=1):
        words = line.split("#", 1)[0].split()
        if words[-2:] in (["xlo", "xhi"], ["ylo", "yhi"], ["zlo", "zhi"]):
            bounds[words[-2][0]] = (float(words[0]), float(words[1]))
        elif words[-3:] == ["xy", "xz", "yz"]:
            tilt = (float(words[0]), float(words[1]), float(words[2]))
        elif words[1:] == ["atoms"]:
            natoms = int(words[0])
        elif words == ["Atoms"]:
            start = k + 1
            break
    if natoms is None or sorted(bounds) != ["x", "y", "z"]:
        raise ValueError(f"data file {path} does not say how many atoms or which box")
    rows = [line.split("#", 1)[0].split() for line in lines[start:]]
    rows = [words for words in rows if words][:natoms]
    table = np.array([[float(w) for w in words[: x_column + 3]] for words in rows])
    table = table[np.argsort(table[:, 0])]
    (xlo, xhi), (ylo, yhi), (zlo, zhi) = bounds["x"], bounds["y"], bounds["z"]
    xy, xz, yz = tilt
    cell = np.array([[xhi - xlo, 0.0, 0.0], [xy, yhi - ylo, 0.0], [xz, yz, zhi - zlo]])
    positions = table[:, x_column : x_column + 3] - np.array([xlo, ylo, zlo])
    fractions = (positions @ np.linalg.inv(cell)) % 1.0
    return fractions @ cell, cell, table[:, type_column].astype(np.int64)


def replicate(
    positions: np.ndarray, cell: np.ndarray, types: np.ndarray, copies: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``copies`` x ``copies`` x ``copies`` periodic images of a box (as LAMMPS's
    ``replicate``): positions, the larger cell and the types, image by image."""
    shifts = np.array(list(np.ndindex(copies, copies, copies)), dtype=np.float64) @ cell
    return (
        (shifts[:, None, :] + positions[None]).reshape(-1, 3),
        cell * copies,
        np.tile(types, len(shifts)),
    )


def element_masses(elements: list[str], needed: bool) -> list[float]:
    """Mass of each element from ``ase.data``; 1.0 where unknown and not ``needed``
    (step 0 does not depend on masses)."""
    try:
        from ase.data import atomic_masses, atomic_numbers
    except ImportError:
        atomic_masses, atomic_numbers = None, {}
    masses = []
    for element in elements:
        if element in atomic_numbers:
            masses.append(float(atomic_masses[atomic_numbers[element]]))
        elif needed:
            why = "ase is not installed" if atomic_masses is None else "not a chemical symbol"
            raise ValueError(
                f"no mass for element {element} ({why}): --steps needs masses; "
                "give a data file with a Masses section (--data)"
            )
        else:
            masses.append(1.0)
    return masses


@dataclass(frozen=True)
class DataHeader:
    ntypes: int
    has_masses: bool
    atom_style: str


def read_data_header(path: Path) -> DataHeader:
    """Atom types, whether masses are given, and the atom style a LAMMPS data file names
    (``Atoms # charge``; atomic when it names none), read up to its Atoms section."""
    ntypes, has_masses, style = None, False, ""
    with open(path) as f:
        f.readline()  # the title line
        for line in f:
            text = line.split("#", 1)[0].strip()
            match = re.fullmatch(r"(\d+)\s+atom\s+types", text)
            if match:
                ntypes = int(match.group(1))
            elif text == "Masses":
                has_masses = True
            elif text == "Atoms":
                style = line.split("#", 1)[1].strip() if "#" in line else "atomic"
                break
        else:
            raise ValueError(f"data file {path} has no Atoms section")
    if ntypes is None:
        raise ValueError(f"data file {path} does not say how many atom types it has")
    return DataHeader(ntypes, has_masses, style or "atomic")
