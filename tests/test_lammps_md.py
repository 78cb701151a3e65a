"""Dynamics: 1,000 NVE steps on 2 ranks under the plugin and under ``lj/cut``.

Both runs start from the same thermalized argon crystal, in one LAMMPS process (``clear``
in between). A small neighbor skin rebuilds the lists every few dozen steps, so atoms
migrate between the two ranks and the ghost shells change during the run.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from lammps_helpers import (
    AR_EPSILON,
    AR_SIGMA,
    ARGON_ATOMS,
    CUTOFF,
    MEASURED,
    assert_same_atoms,
    neighbor_list_builds,
)

from nvalchemi_lammps.lammps_run import read_dump, run_lammps

pytestmark = pytest.mark.lammps

NPROCS = 2
STEPS = 1000
#: Positions are compared after this many steps, to this many Angstrom.
POSITION_STEP, POSITION_TOLERANCE = 100, 1e-8
ENERGY_EVERY = 10
#: Total energies are equal to this relative tolerance (as in the static comparisons).
ENERGY_TOLERANCE = 1e-10

# The shifted potential (pair_modify shift yes) keeps the total energy continuous when a
# pair crosses the cutoff, so what the energy does over the run is the integrator's
# fluctuation and drift, not jumps from the truncation.
REFERENCE = f"""
pair_style lj/cut {CUTOFF}
pair_coeff 1 1 {AR_EPSILON} {AR_SIGMA}
pair_modify shift yes
"""
PLUGIN = """
pair_style nvalchemi {model}
pair_coeff * * Ar
"""


def nve_run(name: str, data, pair_commands: str) -> str:
    """One NVE run from ``data``: unwrapped positions every 100 steps, total energy every
    ``ENERGY_EVERY`` steps, all at full precision."""
    return "".join(
        [
            textwrap.dedent(
                f"""
                clear
                units metal
                atom_style atomic
                read_data {data}
                neighbor 0.5 bin
                neigh_modify every 1 delay 0 check yes
                timestep 0.002
                """
            ),
            textwrap.dedent(pair_commands),
            textwrap.dedent(
                f"""
                fix nve all nve
                thermo {ENERGY_EVERY}
                thermo_style custom step temp pe etotal
                fix energy all print {ENERGY_EVERY} "$(step) $(etotal:%.17g)" &
                    file {name}_energy.txt screen no
                dump positions all custom 100 {name}_*.dump id xu yu zu
                dump_modify positions sort id format float "%.17g"
                run {STEPS}
                """
            ),
        ]
    )


def read_energy(path) -> tuple[np.ndarray, np.ndarray]:
    steps, energies = np.loadtxt(path, comments="#", unpack=True)
    return steps, energies


def test_nve_matches_lj_cut(argon_data, models, tmp_path):
    script = nve_run("reference", argon_data, REFERENCE) + nve_run(
        "plugin", argon_data, PLUGIN.format(model=models["argon_shifted"])
    )
    run = run_lammps(script, NPROCS, tmp_path, timeout=600).check()

    # Both runs rebuilt their neighbor lists many times, the same number of times.
    builds = neighbor_list_builds(run.output)
    assert len(builds) == 2 and builds[0] >= 10, builds
    assert builds[1] == builds[0], builds

    # Positions by atom ID, unwrapped (no jump when an atom crosses the periodic box).
    for step in (POSITION_STEP, STEPS):
        ref = read_dump(tmp_path / f"reference_{step}.dump")
        got = read_dump(tmp_path / f"plugin_{step}.dump")
        assert_same_atoms(got, ref, ARGON_ATOMS)
        xyz = ["xu", "yu", "zu"]
        deviation = max(np.max(np.abs(got[c] - ref[c])) for c in xyz)
        MEASURED.append(("nve_positions_angstrom", f"step_{step}", deviation))
        if step == POSITION_STEP:
            assert deviation <= POSITION_TOLERANCE, (
                f"positions differ by {deviation:.3e} Angstrom after {step} steps"
            )

    # Energy drift. The plugin's forces equal lj/cut's to rounding (~1e-15 relative), and
    # over 1,000 steps of this crystal the two trajectories stay together to ~1e-13
    # Angstrom (measured; as do lj/cut runs on 1 and 2 ranks), so the fair comparison is
    # step by step, not statistical: the drift dE(t) = E(t) - E(0) of one run must equal
    # the other's. Total energies can only be compared to ENERGY_TOLERANCE relative, so
    # that is the tolerance on dE(t) too, in units of |E(0)|. The drift itself must be far
    # larger than that tolerance, or the comparison would say nothing.
    ref_steps, ref_energy = read_energy(tmp_path / "reference_energy.txt")
    got_steps, got_energy = read_energy(tmp_path / "plugin_energy.txt")
    np.testing.assert_array_equal(got_steps, ref_steps)
    assert ref_steps[0] == 0 and ref_steps[-1] == STEPS
    ref_drift = ref_energy - ref_energy[0]
    got_drift = got_energy - got_energy[0]
    tolerance = ENERGY_TOLERANCE * abs(ref_energy[0])
    assert np.max(np.abs(ref_drift)) > 100 * tolerance, "the reference energy barely moves"
    deviation = float(np.max(np.abs(got_drift - ref_drift)))
    MEASURED.append(("nve_energy_drift", "max|dE-dE_ref|/|E0|", deviation / abs(ref_energy[0])))
    MEASURED.append(
        ("nve_energy_drift", "max|dE-dE_ref|/max|dE_ref|", deviation / np.max(np.abs(ref_drift)))
    )
    assert deviation <= tolerance, (
        f"energy drift differs from lj/cut's by up to {deviation:.3e} eV "
        f"(tolerance {tolerance:.3e} eV; lj/cut's drift over the run "
        f"{ref_drift[-1]:.3e} eV, largest excursion {np.max(np.abs(ref_drift)):.3e} eV)"
    )
