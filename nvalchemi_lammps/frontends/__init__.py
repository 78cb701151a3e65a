"""Front doors: the adapters that fill the contract from a LAMMPS build."""
