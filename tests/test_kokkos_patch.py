"""The LAMMPS edits behind 2-rank message passing through KOKKOS ML-IAP on GPUs and its
per-pair arrays' headroom (``tools/patch_lammps_kokkos.py``, docs/gpus.md), checked on the
pinned LAMMPS source that ``tools/build_lammps_mliap.sh`` keeps
(``NVALCHEMI_LAMMPS_MLIAP/kokkos-source``).

The GPU runs themselves are in ``tests/gpu/test_kokkos_cuda.py`` (no GPU here). These tests
fail when the workaround stops being needed (LAMMPS no longer sends ML-IAP's device
buffers to the host pack of its legacy pair communication) or stops applying (the code it
edits changed): either way it is time to look at it again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
FILES = [
    "kokkos.cpp",
    "comm_kokkos.h",
    "comm_kokkos.cpp",
    "pair_mliap_kokkos.cpp",
    "mliap_data_kokkos.cpp",
]


@pytest.fixture(scope="module")
def lammps_source() -> Path:
    prefix = os.environ.get("NVALCHEMI_LAMMPS_MLIAP")
    if not prefix:
        pytest.skip("NVALCHEMI_LAMMPS_MLIAP is not set: no LAMMPS source here (make test sets it)")
    if (Path(prefix) / "UNAVAILABLE").exists():
        pytest.skip((Path(prefix) / "UNAVAILABLE").read_text().strip())
    source = Path(prefix) / "kokkos-source"
    assert all((source / "src/KOKKOS" / f).exists() for f in FILES), (
        f"{source} lacks the KOKKOS sources: rerun tools/build_lammps_mliap.sh"
    )
    return source


def _patch(tree: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(TOOLS / "patch_lammps_kokkos.py"), str(tree)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.splitlines()


def test_legacy_pair_comm_still_reads_device_buffers_on_the_host(lammps_source):
    """Why the edit exists: without GPU-aware MPI, more than one rank forces KOKKOS's pair
    communication onto the legacy host path, whose pack reads ML-IAP's exchange buffer
    (GPU memory) on the host."""
    kokkos = (lammps_source / "src/KOKKOS/kokkos.cpp").read_text()
    forced = re.search(
        r"if \(\(!gpu_aware_flag && nmpi > 1\).*?\{(.*?)\n  \}\n\n", kokkos, re.DOTALL
    )
    assert forced and "forward_pair_comm_legacy = 1;" in forced.group(1)
    assert "reverse_pair_comm_legacy = 1;" in forced.group(1)
    comm = (lammps_source / "src/KOKKOS/comm_kokkos.cpp").read_text()
    assert (
        "forward_pair_comm_legacy) {\n    k_sendlist.sync_host();\n    CommBrick::forward_comm(pair"
        in comm
    )
    mliap = (lammps_source / "src/KOKKOS/pair_mliap_kokkos.cpp").read_text()
    host_pack = re.search(
        r"::pack_forward_comm\(int nv, int\* idx_v, double \*fill,\s*int /\*int2\*/"
        r".*?\n\}",
        mliap,
        re.DOTALL,
    )
    assert host_pack and "copy_to[gstart++]" in host_pack.group(0)
    assert "comm->forward_comm(this);" in mliap and "comm->reverse_comm(this);" in mliap


def test_device_pair_comm_staging_still_trips_over_a_resize(lammps_source):
    """Why the second edit exists: the device pair comm, staged through the host, marks its
    receive buffer modified on the host after ``grow_buf_pair`` resized it, which Kokkos
    marks modified on the device: Kokkos aborts (seen on the H200 at 2 ranks)."""
    comm = (lammps_source / "src/KOKKOS/comm_kokkos.cpp").read_text()
    grow = comm[comm.index("void CommKokkos::grow_buf_pair") :]
    grow = grow[: grow.index("\n}\n")]
    assert "k_buf_recv_pair.resize(max_buf_pair);" in grow and "clear_sync_state" not in grow
    device = comm[comm.index("void CommKokkos::forward_comm_device(Pair *pair, int size)") :]
    assert device.index("grow_buf_pair(nmax)") < device.index("k_buf_recv_pair.modify_host();")


def _pair_arrays_growth(source: str) -> str:
    """The block of ``MLIAPDataKokkos::grow_neigharrays`` that reallocates the per-pair
    arrays when a step has more pairs than they hold."""
    grow = source[source.index("::grow_neigharrays()") :]
    block = grow[grow.index("  if (nneigh_max < npairs) {") :]
    return block[: block.index("\n   }\n")]


def test_mliap_pair_arrays_still_grow_to_exactly_the_pairs(lammps_source):
    """Why the third edit exists: ML-IAP (KOKKOS) reallocates its per-pair arrays to exactly
    this step's pair count, so a count that keeps growing reallocates them every step (on
    an H200: 40 ms per step at 97,556 atoms, measured 2026-12-04)."""
    source = (lammps_source / "src/KOKKOS/mliap_data_kokkos.cpp").read_text()
    growth = _pair_arrays_growth(source)
    assert "nneigh_max = npairs;" in growth
    for array in ("jatoms", "pair_i", "jelems", "rij", "graddesc"):
        assert re.search(rf"create_kokkos\(k_{array}, {array}, npairs\b", growth), array


def test_patch_applies_once(lammps_source, tmp_path):
    """Every edit applies to the pinned source, and a second run changes nothing."""
    tree = tmp_path / "lammps"
    shutil.copytree(lammps_source, tree)
    first = _patch(tree)
    assert len(first) == 7 and all(line.startswith("patched ") for line in first), first
    patched = {f: (tree / "src/KOKKOS" / f).read_text() for f in FILES}
    second = _patch(tree)
    assert all(line.startswith("already patched ") for line in second), second
    assert patched == {f: (tree / "src/KOKKOS" / f).read_text() for f in FILES}
    mliap = patched["pair_mliap_kokkos.cpp"]
    assert "commKK->forward_comm_on_device(this)" in mliap
    assert "commKK->reverse_comm_on_device(this)" in mliap
    comm = patched["comm_kokkos.cpp"]
    assert "void CommKokkos::forward_comm_on_device(Pair *pair, int size)" in comm
    grow = comm[comm.index("void CommKokkos::grow_buf_pair") :]
    assert grow.index("k_buf_recv_pair.clear_sync_state();") < grow.index("\n}\n")
    growth = _pair_arrays_growth(patched["mliap_data_kokkos.cpp"])
    assert "nneigh_max = nalloc;" in growth and "npairs / 5" in growth
    for array in ("jatoms", "pair_i", "jelems", "rij", "graddesc"):
        assert re.search(rf"create_kokkos\(k_{array}, {array}, nalloc\b", growth), array
