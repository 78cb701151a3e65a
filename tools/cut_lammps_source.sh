#!/usr/bin/env bash
# The part of a LAMMPS source tree that tools/build_lammps_kokkos.sh builds from, small enough
# to carry to a GPU node without internet (docs/kokkos_build.md).
#
#   tools/cut_lammps_source.sh SOURCE OUT [PACKAGE...]
#
# SOURCE   a LAMMPS source tarball (Debian's lammps_*.orig.tar.gz, a release tarball with its
#          top folder) or source tree
# OUT      the folder to write: LICENSE, cmake/, python/, doc/lammps.1 (the install copies
#          the man page), src/ with its own files, fmt/, nlohmann/ and the packages' folders
# PACKAGE  the packages to keep, default those of the build script: KOKKOS ML-IAP ML-SNAP
#          PYTHON PLUGIN
# KOKKOS_STYLES  if set, the core styles whose KOKKOS variants (src/KOKKOS/STYLE_kokkos.*)
#          stay, e.g. "pair_lj_cut fix_nve compute_temp": the variants of the other core
#          styles are left out (56 of 590 build steps fewer), so that a build fits a job's
#          time limit. Those styles still run under `-sf kk`, on the host, as every style
#          without a KOKKOS variant does. Variants of the packages' styles stay, but for
# KOKKOS_LEAVE_OUT  (with KOKKOS_STYLES) package styles whose KOKKOS variants go too; by
#          default ML-SNAP's (ML-IAP needs the package, nothing here its KOKKOS styles: SNAP's
#          kernels, heavy templates; pair_snap's was the last object a 16-core CUDA build
#          finished); set it empty to keep them
#
# Debian's 214 MB tarball gives 23 MB, 3.7 MB as `tar | xz -6`.
set -euo pipefail

[ $# -ge 2 ] || { sed -n '2,19p' "$0"; exit 2; }
source=$(realpath "$1")
out=$(realpath -m "$2")
shift 2
packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(KOKKOS ML-IAP ML-SNAP PYTHON PLUGIN)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -d "$source" ]; then
  tree=$source
else
  tar xf "$source" -C "$work" --wildcards '*cmake/*' '*python/*' '*doc/lammps.1' '*src/*' '*LICENSE'
  tree=$(dirname "$(find "$work" -maxdepth 3 -path '*/cmake/CMakeLists.txt' | head -1)")
  tree=$(dirname "$tree")
fi
[ -f "$tree/cmake/CMakeLists.txt" ] || { echo "$source: no LAMMPS source (cmake/CMakeLists.txt)"; exit 1; }

rm -rf "$out"
mkdir -p "$out/src" "$out/doc"
cp -r "$tree/cmake" "$tree/python" "$out/"
cp "$tree/doc/lammps.1" "$out/doc/"
cp "$tree/LICENSE" "$out/"  # GPL: the license travels with the source
find "$tree/src" -maxdepth 1 -type f -exec cp {} "$out/src/" \;
for folder in fmt nlohmann "${packages[@]}"; do
  [ -d "$tree/src/$folder" ] || { echo "$source: no src/$folder"; exit 1; }
  cp -r "$tree/src/$folder" "$out/src/"
done

if [ -n "${KOKKOS_STYLES:-}" ] && [ -d "$out/src/KOKKOS" ]; then
  cd "$out/src/KOKKOS"
  # named in KOKKOS.cmake (built whatever the styles), or kept by the caller
  keep=" $(grep -o '[a-z0-9_]*_kokkos\.cpp' ../../cmake/Modules/Packages/KOKKOS.cmake \
          | sed 's/_kokkos\.cpp$//' | tr '\n' ' ') $(echo ${KOKKOS_STYLES}) "
  left_out=()
  for file in *_kokkos.cpp; do
    style=${file%_kokkos.cpp}
    case $style in pair_* | fix_* | compute_* | bond_* | angle_* | dihedral_* | improper_* \
      | region_* | dump_*) ;; *) continue ;; esac  # not atom styles, integrators, lists
    [ -f "../$style.cpp" ] || continue  # a package's style, or KOKKOS's own
    case $keep in *" $style "*) continue ;; esac
    left_out+=("${style}_kokkos")
  done
  core=${#left_out[@]}
  if [ -n "${KOKKOS_LEAVE_OUT+set}" ]; then  # named: each must be there
    for style in $KOKKOS_LEAVE_OUT; do
      [ -f "${style}_kokkos.cpp" ] || { echo "no KOKKOS variant of $style to leave out"; exit 1; }
      left_out+=("${style}_kokkos")
    done
  else  # the default: those this LAMMPS has
    for style in pair_snap compute_sna_grid compute_sna_grid_local compute_gaussian_grid_local; do
      if [ -f "${style}_kokkos.cpp" ]; then left_out+=("${style}_kokkos"); fi
    done
  fi
  for name in "${left_out[@]}"; do rm -f "$name.cpp" "$name.h" "${name}_impl.h"; done
  # what is built must not include what went (variants of styles of packages not kept,
  # never built, may)
  for name in "${left_out[@]}"; do
    for file in $(grep -lE "\"$name(_impl)?\.h\"" -- *.cpp *.h 2>/dev/null || true); do
      base=${file%_kokkos.*}
      if [ -f "../$base.cpp" ] || compgen -G "../*/$base.cpp" >/dev/null || [ "$base" = "$file" ]; then
        echo "$file includes $name.h: keep ${name%_kokkos} (in KOKKOS_STYLES, or out of" \
          "KOKKOS_LEAVE_OUT)"; exit 1
      fi
    done
  done
  echo "left out the KOKKOS variants of $core core styles and $(( ${#left_out[@]} - core )) of packages"
fi
echo "$out: $(du -sh "$out" | cut -f1), packages ${packages[*]}"
