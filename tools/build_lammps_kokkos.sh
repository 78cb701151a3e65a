#!/usr/bin/env bash
# A LAMMPS with KOKKOS on NVIDIA GPUs, ML-IAP and PYTHON: `pair_style mliap unified model.pt 0`
# with `-k on g N -sf kk -pk kokkos newton on neigh half` (docs/kokkos_build.md).
#
#   tools/build_lammps_kokkos.sh LAMMPS_SRC KOKKOS_SRC PREFIX [ARCH]
#
# LAMMPS_SRC  a LAMMPS source tree (cmake/, src/, python/), e.g. Debian's
#             lammps_20260704+dfsg.orig.tar.gz unpacked, or a git checkout
# KOKKOS_SRC  a Kokkos source tree; used as LAMMPS's lib/kokkos (Debian strips the bundled
#             one). Kokkos 4.6.99 (June 2025) is patched for CUDA 13 and LAMMPS 2026 here
# PREFIX      installs lmp, liblammps.so, headers and CMake config into PREFIX/install and
#             LAMMPS's Python module into PREFIX/python
# ARCH        Kokkos architecture, default HOPPER90 (H100/H200); AMPERE80 for A100; SERIAL
#             for Kokkos on the host only (no GPU: the KOKKOS code paths on a CPU)
# LAMMPS_CMAKE_ARGS  more CMake arguments (e.g. an MPI: -D MPI_CXX_COMPILER=...)
#
# Packages: KOKKOS (CUDA + Serial host), ML-IAP with Python (MLIAP_ENABLE_PYTHON), ML-SNAP
# (ML-IAP needs it), PYTHON and PLUGIN, with MPI, as a shared library.
# Needs nvcc, a C++17 host compiler, an MPI, CMake >= 3.20, Python with cython, and
# BUILD_JOBS cores (default: all).
# Rerunning the script continues a build that was cut off (the build folder is kept until
# the install is done).
set -euo pipefail

lammps_src=$(realpath "$1")
kokkos_src=$(realpath "$2")
prefix=$(realpath -m "$3")
arch=${4:-HOPPER90}
jobs=${BUILD_JOBS:-$(nproc)}
python=${PYTHON:-python3}
here=$(dirname "$(realpath "$0")")

# a cut source tree (tools/cut_lammps_source.sh) must still have what the build and the
# install read: stop now rather than minutes into the build
for part in cmake/CMakeLists.txt python/lammps doc/lammps.1 src/fmt src/nlohmann \
            src/KOKKOS src/ML-IAP src/ML-SNAP src/PYTHON src/PLUGIN; do
  [ -e "$lammps_src/$part" ] \
    || { echo "$lammps_src has no $part: tools/cut_lammps_source.sh keeps what is needed" >&2; exit 2; }
done

start=$(date +%s)
mkdir -p "$prefix"
# LAMMPS finds Kokkos at lib/kokkos of its own tree
if [ ! -e "$lammps_src/lib/kokkos/CMakeLists.txt" ]; then
  mkdir -p "$lammps_src/lib"
  rm -rf "$lammps_src/lib/kokkos"
  cp -r "$kokkos_src" "$lammps_src/lib/kokkos"
fi
"$python" "$here/patch_kokkos.py" "$lammps_src/lib/kokkos"
"$python" "$here/patch_lammps_kokkos.py" "$lammps_src"

if [ "$arch" = SERIAL ]; then  # Kokkos on the host only: the /kk code paths without a GPU
  backend=(-D Kokkos_ENABLE_CUDA=off)
else
  # nvcc_wrapper compiles for its default_arch when no -arch is given; passing -arch in
  # CMAKE_CXX_FLAGS breaks Kokkos's link-flag check, so the default is set instead
  declare -A sm=([HOPPER90]=sm_90 [AMPERE80]=sm_80 [AMPERE86]=sm_86 [ADA89]=sm_89
                 [BLACKWELL100]=sm_100 [BLACKWELL120]=sm_120)
  wrapper="$lammps_src/lib/kokkos/bin/nvcc_wrapper"
  grep -q "^default_arch=\"${sm[$arch]}\"" "$wrapper" \
    || sed -i "s/^default_arch=\"sm_[0-9]*\"/default_arch=\"${sm[$arch]}\"/" "$wrapper"
  backend=(-D CMAKE_CXX_COMPILER="$wrapper" -D Kokkos_ENABLE_CUDA=on -D "Kokkos_ARCH_$arch=on")
fi
# LAMMPS installs bench/ and potentials/ as data: a trimmed source tree may lack them
mkdir -p "$lammps_src/bench" "$lammps_src/potentials"

"$python" -c "import Cython" 2>/dev/null || { echo "cython is missing for $python"; exit 1; }
build="$prefix/build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$lammps_src/cmake" -B "$build" -G Ninja \
    -D CMAKE_BUILD_TYPE=Release -D BUILD_SHARED_LIBS=on -D BUILD_MPI=on -D BUILD_OMP=off \
    -D PKG_KOKKOS=on "${backend[@]}" -D Kokkos_ENABLE_SERIAL=on -D Kokkos_ENABLE_OPENMP=off \
    -D PKG_ML-IAP=on -D PKG_ML-SNAP=on -D PKG_PYTHON=on -D MLIAP_ENABLE_PYTHON=on \
    -D PKG_PLUGIN=on \
    -D Python_EXECUTABLE="$(command -v "$python")" \
    -D WITH_JPEG=off -D WITH_PNG=off -D WITH_GZIP=off -D WITH_FFMPEG=off -Wno-dev \
    ${LAMMPS_CMAKE_ARGS:-}
fi
cmake --build "$build" -j "$jobs"
cmake --install "$build" --prefix "$prefix/install"
# LAMMPS's Python module (it finds liblammps.so through LD_LIBRARY_PATH)
rm -rf "$prefix/python"
mkdir -p "$prefix/python"
cp -r "$lammps_src/python/lammps" "$prefix/python/lammps"
rm -rf "$build"

lmp="$prefix/install/bin/lmp"
lib=$(ls "$prefix"/install/lib*/liblammps.so)
echo "built in $(( $(date +%s) - start )) s with $jobs jobs: $lmp"
echo "liblammps.so: $(du -hL "$lib" | cut -f1)"
LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}" "$lmp" -h \
  | sed -n '/^Installed packages:/,/^List of individual style options/p' | sed '$d'
