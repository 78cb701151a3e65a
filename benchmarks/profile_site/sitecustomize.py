"""Put first on PYTHONPATH (with benchmarks/) by ``kokkos_lammps.py bench --profile``: LAMMPS's
embedded Python runs this at start, and step_profile.install() wraps the doors' per-step
calls when NVALCHEMI_PROFILE, NVALCHEMI_MEMORY or NVALCHEMI_PHASES is set."""

import step_profile

step_profile.install()
