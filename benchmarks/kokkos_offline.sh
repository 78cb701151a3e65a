#!/usr/bin/env bash
# The KOKKOS benchmarks (kokkos_lammps.py, kokkos_fixed_cost.py) on a GPU machine without
# internet, in two steps: `stage` where there is internet, `build` on the GPU machine; then
# run the benchmark there with PYTHONPATH=PREFIX/site and --lammps PREFIX.
#
#   benchmarks/kokkos_offline.sh stage DIR [PYTHON_VERSION]      # here: default 3.12
#   benchmarks/kokkos_offline.sh build DIR PREFIX [ARCH] [SECONDS] # there: default HOPPER90
#
# stage  DIR/wheels: mace-torch and its pure-Python needs, for the GPU machine's Python
#        (torch, numpy, scipy, opt-einsum(-fx) and cython are expected there);
#        DIR/lammps-cut.tar.xz: Debian's LAMMPS source cut by tools/cut_lammps_source.sh to
#        what the build reads, without the KOKKOS variants of core styles these runs do not
#        use (the build and the plugin then fit a 10-minute job on 16 cores);
#        DIR/models: kokkos_lammps.py prepare (model files, data, references), with this
#        environment's Python (mace-torch installed: `make setup`).
# build  installs DIR/wheels into PREFIX/site (outside DIR, which a later call may carry
#        again), then builds LAMMPS into PREFIX (continuing a
#        build cut off by SECONDS, default no limit: rerun to go on) and the nvalchemi/kk
#        plugin; exits 3 when SECONDS ran out before LAMMPS was installed.
set -euo pipefail

root=$(dirname "$(dirname "$(realpath "$0")")")
[ $# -ge 2 ] || { sed -n '2,18p' "$0"; exit 2; }
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
    prettytable configargparse lmdb orjson gitpython gitdb smmap wcwidth
  python3 -m pip wheel -q --no-deps -w "$dir/wheels" python-hostlist  # no wheel on PyPI

  local tarball=$dir/lammps_20260704+dfsg.orig.tar.gz
  [ -f "$tarball" ] || curl -sSfL -o "$tarball" \
    http://deb.debian.org/debian/pool/main/l/lammps/lammps_20260704+dfsg.orig.tar.gz
  KOKKOS_STYLES="pair_lj_cut fix_nve fix_nvt fix_npt fix_nph fix_langevin fix_momentum
    fix_setforce fix_property_atom fix_minimize fix_neigh_history fix_dt_reset compute_temp
    pair_hybrid pair_hybrid_overlay pair_zero" \
    bash "$root/tools/cut_lammps_source.sh" "$tarball" "$dir/lammps"
  tar cf - -C "$dir" lammps | xz -6 -T0 > "$dir/lammps-cut.tar.xz"
  rm -rf "$dir/lammps" "$tarball"

  "$root/.venv/bin/python" "$root/benchmarks/kokkos_lammps.py" prepare "$dir/models"
  # the GPU machine has no cuEquivariance: the e3nn files must load without it
  "$root/.venv/bin/python" - "$dir/models" <<'EOF'
import sys
from pathlib import Path
sys.modules.update(dict.fromkeys(["cuequivariance", "cuequivariance_torch"]))  # unimportable
from nvalchemi_lammps import load_model
for name in ("mace32", "mace64", "mace32_e3nn", "mace64_e3nn"):
    load_model(Path(sys.argv[1]) / f"{name}.pt")
EOF
  du -sh "$dir"
}

build() {
  local prefix arch=${2:-HOPPER90} seconds=${3:-0} start=$SECONDS
  prefix=$(realpath -m "$1")
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$prefix/site" "$dir"/wheels/*.whl
  export PYTHONPATH=$prefix/site
  local src=$prefix/source/lammps
  if [ ! -x "$prefix/install/bin/lmp" ]; then
    if [ ! -d "$src" ]; then
      mkdir -p "$prefix/source"
      tar xJf "$dir/lammps-cut.tar.xz" -C "$prefix/source"
      mkdir -p "$src/lib"
      tar xJf "$root"/third_party/kokkos-*.tar.xz -C "$src/lib"
    fi
    local rc=0
    timeout "$seconds" bash "$root/tools/build_lammps_kokkos.sh" "$src" "$src/lib/kokkos" \
      "$prefix" "$arch" || rc=$?
    [ $rc -eq 124 ] && echo "LAMMPS not built yet after $((SECONDS - start)) s: run again"
    [ $rc -eq 0 ] || exit $((rc == 124 ? 3 : rc))
  fi
  [ -f "$prefix/plugin-build/cpp_bridge/nvalchemiplugin.so" ] \
    || bash "$root/tools/build_plugin_kokkos.sh" "$src" "$src/lib/kokkos" "$prefix" "$arch"
  echo "LAMMPS and the plugin in $prefix after $((SECONDS - start)) s"
}

case ${1:-} in
  stage) stage "${@:3}" ;;
  build) build "${@:3}" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
