#!/bin/bash
# Argon through pair_style nvalchemi/kk on GPU nodes: one MPI rank per GPU, atoms, neighbor
# lists and the model on the GPUs. Needs a KOKKOS LAMMPS and the plugin compiled against it
# (tools/build_lammps_kokkos.sh and tools/build_plugin_kokkos.sh, docs/kokkos_build.md).
# The same lines run in.alloy_mace and in.water_uma (their headers make the model files),
# and, with -var door mliap, pair_style mliap unified.
#
#   sbatch slurm_gpu_kokkos.sh
#   PREFIX=/path/to/lammps-kokkos VENV=/path/to/venv sbatch slurm_gpu_kokkos.sh
#
#SBATCH --job-name=argon-nvalchemi-kk
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=00:30:00
#SBATCH --output=%x-%j.out

set -euo pipefail

# PREFIX: the build scripts' PREFIX (install/, python/, plugin-build/); VENV: the
# environment with a CUDA torch and nvalchemi-lammps (adapt both)
PREFIX=${PREFIX:-$HOME/lammps-kokkos}
VENV=${VENV:-$HOME/nvalchemi-lammps/.venv}

export PATH=$PREFIX/install/bin:$PATH
libdir=$(dirname "$(ls "$PREFIX"/install/lib*/liblammps.so | head -n 1)")   # lib or lib64
export LD_LIBRARY_PATH=$libdir:${LD_LIBRARY_PATH:-}
# LAMMPS's embedded Python starts from the system prefix: give it the environment's packages
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export PYTHONPATH=$PREFIX/python:$site:${PYTHONPATH:-}
export NVALCHEMI_LAMMPS_PYTHON=$VENV/bin/python
# LAMMPS loads the plugin from here at start-up (no plugin load line in the input)
export LAMMPS_PLUGIN_PATH=$PREFIX/plugin-build/cpp_bridge
export OMP_NUM_THREADS=1
# torch's memory pool grows by mapping instead of keeping fixed blocks (large systems)
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

cd "$SLURM_SUBMIT_DIR"
[ -f argon.pt ] || "$VENV/bin/nvalchemi-lammps" export --default -o argon.pt

# Every rank sees all the node's GPUs and KOKKOS gives rank i of the node GPU i (SLURM_LOCALID
# modulo g): --gpu-bind=none keeps a site's default per-task binding off (a rank that saw
# one GPU would be asked for device 1, 2, 3). With --gpus-per-task=1 and per-task binding
# instead, write -k on g 1. srun takes --cpus-per-task from the job only when told (Slurm
# 22.05 and later). -sf kk makes pair_style nvalchemi nvalchemi/kk; newton on is required.
# With a GPU-aware MPI, add gpu/aware on after neigh half.
srun --gpu-bind=none --cpus-per-task="$SLURM_CPUS_PER_TASK" \
     lmp -k on g "${SLURM_GPUS_ON_NODE:-4}" -sf kk -pk kokkos newton on neigh half \
     -in in.argon -var cells 32
