"""Ionic systems and LAMMPS inputs the electrostatics tests through LAMMPS share
(tests/test_lammps_ewald.py, tests/test_lammps_pme.py): molten NaCl, a rock-salt slab, and
LAMMPS's own coul/long."""

from __future__ import annotations

import functools
import tempfile
import textwrap
from pathlib import Path

import numpy as np
from lammps_helpers import PRESSURE, print_results

from nvalchemi_lammps.lammps_run import read_dump, read_results, run_lammps, write_lammps_data

#: Rock salt, 5x5x5 conventional cells: 1,000 ions, each displaced ~0.2 Angstrom.
LATTICE, CELLS, DISPLACEMENT = 5.64, 5, 0.2
CUTOFF = 10.0
ACCURACY = 1e-6
MASSES = [22.98977, 35.453]
#: LAMMPS's erfc in coul/long is a polynomial fit (A&S 7.1.26, absolute error ~1e-7); with
#: alpha and the k-vectors matched that is the whole difference (measured: ~1e-7).
LAMMPS_TOLERANCE = 2e-6


def rock_salt(
    cells_z: int = CELLS, periodic_z: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    fcc = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    grid = np.array(
        [[i, j, k] for i in range(CELLS) for j in range(CELLS) for k in range(cells_z)], float
    )
    sodium = (grid[:, None, :] + fcc[None]).reshape(-1, 3)
    chlorine = sodium + np.array([0.5, 0.0, 0.0])
    cell = np.diag([LATTICE * CELLS, LATTICE * CELLS, LATTICE * cells_z])
    rng = np.random.default_rng(11)
    frac = np.vstack([sodium, chlorine]) / np.array([CELLS, CELLS, cells_z])
    positions = frac @ cell + rng.normal(0.0, DISPLACEMENT, size=frac.shape)
    wrapped = 3 if periodic_z else 2
    positions[:, :wrapped] = np.mod(positions[:, :wrapped], np.diag(cell)[:wrapped])
    types = np.repeat([1, 2], len(sodium))
    charges = np.where(types == 1, 1.0, -1.0)
    return positions, cell, types, charges


#: Tosi-Fumi NaCl for ``pair_style born/coul/long`` (metal units: A, rho, sigma, C, D), only
#: to melt the crystal for the periodic system.
BORN_MAYER_HUGGINS = {
    (1, 1): "0.263690 0.317 2.340 1.048553 -0.49935",
    (1, 2): "0.210917 0.317 2.755 6.99055303 -8.6757",
    (2, 2): "0.158221 0.317 3.170 72.4077 -145.427",
}
MELT_TEMPERATURE, MELT_STEPS = 2500.0, 2000


@functools.cache
def molten_salt() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 1,000-ion crystal of :func:`rock_salt` melted by LAMMPS: Born-Mayer-Huggins +
    Coulomb (PPPM), NVT at 2,500 K for 2 ps at the crystal's density (NaCl melts at
    1,074 K): a liquid's disorder, ions as close as the melt brings them."""
    positions, cell, types, charges = rock_salt()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        data = write_lammps_data(workdir / "crystal.data", positions, cell, types, MASSES, charges)
        coefficients = "\n".join(
            f"pair_coeff {i} {j} {v}" for (i, j), v in BORN_MAYER_HUGGINS.items()
        )
        script = textwrap.dedent(
            f"""            units metal
            atom_style charge
            read_data {data}
            pair_style born/coul/long 9.0
            {{coefficients}}
            kspace_style pppm 1e-4
            velocity all create {MELT_TEMPERATURE} 8675309 loop geom
            fix nvt all nvt temp {MELT_TEMPERATURE} {MELT_TEMPERATURE} 0.1
            timestep 0.001
            thermo 500
            run {MELT_STEPS}
            write_dump all custom melt.dump id x y z modify sort id format float "%.17g"
            """
        ).replace("{coefficients}", coefficients)
        run_lammps(script, 1, workdir, timeout=300).check()
        melt = read_dump(workdir / "melt.dump")
    melted = np.stack([melt[c] for c in ("x", "y", "z")], axis=1)
    return np.mod(melted, np.diag(cell)), cell, types, charges


#: The slab: rock salt 5x5x4 cells (800 ions), Na shifted up and Cl down along z (a dipole
#: normal to the slab, whose correction is then large), from z = 2 A in a box 40 A high.
SLAB_CELLS, SLAB_SHIFT, SLAB_BOTTOM, SLAB_HEIGHT, SLAB_FACTOR = 4, 0.1, 2.0, 40.0, 3.0
#: Subdomains stacked along z: at 4 ranks the top quarter (z > 30 A) holds no atom.
SLAB_PROCESSORS = {1: "", 2: "processors 1 1 2", 4: "processors 1 1 4"}


def slab_rock_salt() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    positions, cell, types, charges = rock_salt(SLAB_CELLS, periodic_z=False)
    positions[:, 2] += np.where(types == 1, SLAB_SHIFT, -SLAB_SHIFT) + SLAB_BOTTOM
    cell[2, 2] = SLAB_HEIGHT
    return positions, cell, types, charges


def lammps_script(data: Path, interaction: str, atom_style: str = "charge", setup: str = "") -> str:
    return textwrap.dedent(
        f"""\
        units metal
        atom_style {atom_style}
        atom_modify map array
        {setup}
        read_data {data}
        {interaction}
        thermo_style custom step pe {" ".join(PRESSURE)}
        dump d all custom 1 atoms.dump id fx fy fz
        dump_modify d sort id format float "%.17g"
        run 0
        """
    ) + print_results("RESULT", {"pe": "pe", **{p: p for p in PRESSURE}})


def coul_long(kspace: str) -> str:
    return f"pair_style coul/long {CUTOFF}\npair_coeff * *\npair_modify table 0\n{kspace}"


def read_outputs(workdir: Path, output: str) -> dict[str, np.ndarray]:
    atoms, glob = read_dump(workdir / "atoms.dump"), read_results(output)
    return {
        "energy": np.array([glob["pe"]]),
        "force": np.stack([atoms[c] for c in ("fx", "fy", "fz")], axis=1),
        "pressure": np.array([glob[p] for p in PRESSURE]),
    }


def slab_setup(nprocs: int) -> str:
    return f"boundary p p f\n{SLAB_PROCESSORS[nprocs]}"


def ionic_data(folder: Path, geometry: str) -> Path:
    """The molten salt (``periodic``) or the rock-salt slab (``slab``) as a data file with
    charges in ``folder``."""
    positions, cell, types, charges = molten_salt() if geometry == "periodic" else slab_rock_salt()
    path = folder / f"{geometry}.data"
    return write_lammps_data(path, positions, cell, types, MASSES, charges=charges)
