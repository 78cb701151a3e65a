#!/usr/bin/env bash
# The part of a LAMMPS source tree that tools/build_lammps_kokkos.sh builds from, small enough
# to carry to a GPU node without internet (docs/kokkos.md, "Building").
#
#   tools/cut_lammps_source.sh SOURCE OUT [PACKAGE...]
#
# SOURCE   a LAMMPS source tarball (Debian's lammps_*.orig.tar.gz, a release tarball with its
#          top folder) or source tree
# OUT      the folder to write: LICENSE, cmake/, python/, doc/lammps.1 (the install copies
#          the man page), src/ with its own files, fmt/, nlohmann/ and the packages' folders
# PACKAGE  the packages to keep, default those of the build script: KOKKOS ML-IAP ML-SNAP
#          PYTHON PLUGIN
#
# Debian's 214 MB tarball gives 23 MB, 3.7 MB as `tar | xz -6`.
set -euo pipefail

[ $# -ge 2 ] || { sed -n '2,15p' "$0"; exit 2; }
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
echo "$out: $(du -sh "$out" | cut -f1), packages ${packages[*]}"
