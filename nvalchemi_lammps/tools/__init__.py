"""What the CLI, the tests and the benchmarks share: structures, LAMMPS runs of a model
file, the receptive-field probe. The single-process reference is ``nvalchemi_lammps.
reference``, running LAMMPS itself ``nvalchemi_lammps.lammps_run``."""
