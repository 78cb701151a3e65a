"""Route ML-IAP's feature exchanges through KOKKOS's device communication (idempotent).

    python tools/patch_lammps_kokkos.py LAMMPS_SRC

``data.forward_exchange``/``reverse_exchange`` (KOKKOS ML-IAP, used by message-passing
models) call ``comm->forward_comm(this)`` on buffers in GPU memory. When MPI is not
GPU-aware and more than one rank runs (or with ``pair/only on``), KokkosLMP forces the
pair communication onto the legacy host path (src/KOKKOS/kokkos.cpp), CommBrick calls
PairMLIAPKokkos's host ``pack_forward_comm``, which reads the GPU buffer from the host: a
segmentation fault (docs/gpus.md, "Known problems"). The device path stages its MPI
buffers through the host when MPI is not GPU-aware, so the exchanges of a pair style
running on the GPU take it always; that staging, never reached before, aborts in Kokkos
("Concurrent modification of host and device views in DualView comm:k_recv_send_pair")
after the pair buffers grow, since a DualView resize marks the device side modified: the
grown buffers, scratch, start with no side modified. Without the original text (a LAMMPS
that fixed this itself) each edit is skipped and said so.

The third edit is for speed: ML-IAP (KOKKOS) sizes its per-pair arrays (pair vectors,
indices, descriptor gradients: DualViews, a host copy each) to exactly the pairs of the
step that outgrew them, and reallocates all of them, zero-filled on both sides, whenever a
step has more pairs than any before. On a heating crystal that is every step: 40 ms per
step at 97,556 atoms on an H200, more than the model (docs/performance.md, round 13). They
grow by a fifth more than needed here, so a growing pair count reallocates a few times.
"""

from __future__ import annotations

import sys
from pathlib import Path

from patch_kokkos import apply

DECLARATION = (
    "  void reverse_comm(class Pair *, int size = 0) override;     // reverse comm from a Pair\n"
)
DEFINITION_ANCHOR = "/* ---------------------------------------------------------------------- */\n\nvoid CommKokkos::grow_buf_pair(int n) {"
FORWARD_CALL = "  //call comm\n  comm->forward_comm(this);\n"
REVERSE_CALL = "  comm->reverse_comm(this);\n"
INCLUDE = '#include "pair_mliap_kokkos.h"\n'
GROW = "  k_buf_send_pair.resize(max_buf_pair);\n  k_buf_recv_pair.resize(max_buf_pair);\n"
PAIR_ARRAYS = """  if (nneigh_max < npairs) {
    memoryKK->destroy_kokkos(k_jatoms,jatoms);
    memoryKK->create_kokkos(k_jatoms, jatoms, npairs, "mliap_data:jatoms");
    memoryKK->destroy_kokkos(k_pair_i,pair_i);
    memoryKK->create_kokkos(k_pair_i, pair_i, npairs, "mliap_data:pair_i");
    memoryKK->destroy_kokkos(k_jelems,jelems);
    memoryKK->create_kokkos(k_jelems, jelems, npairs, "mliap_data:jelems");
    memoryKK->destroy_kokkos(k_rij,rij);
    memoryKK->create_kokkos(k_rij, rij, npairs, 3, "mliap_data:rij");

    if (gradgradflag == 0){
      memoryKK->destroy_kokkos(k_graddesc,graddesc);
      memoryKK->create_kokkos(k_graddesc, graddesc, npairs, ndescriptors,3, "mliap_data:graddesc");
    }
    nneigh_max = npairs;
   }
"""

EDITS = {
    "src/KOKKOS/comm_kokkos.h": {
        DECLARATION: DECLARATION
        + "  void forward_comm_on_device(class Pair *, int size = 0);    // device path, any MPI\n"
        + "  void reverse_comm_on_device(class Pair *, int size = 0);    // device path, any MPI\n",
    },
    "src/KOKKOS/comm_kokkos.cpp": {
        DEFINITION_ANCHOR: """/* ----------------------------------------------------------------------
   pair comm on the device also where MPI is not GPU-aware (the buffers are staged
   through the host then): for pair styles whose buffers live in device memory only
------------------------------------------------------------------------- */

void CommKokkos::forward_comm_on_device(Pair *pair, int size)
{
  k_sendlist.sync_device();
  forward_comm_device<LMPDeviceType>(pair, size);
}

void CommKokkos::reverse_comm_on_device(Pair *pair, int size)
{
  k_sendlist.sync_device();
  reverse_comm_device<LMPDeviceType>(pair, size);
}

"""
        + DEFINITION_ANCHOR,
        GROW: GROW
        + "  // scratch: nothing to copy. A resize marks one side modified, and the host staging\n"
        + "  // of the device path (MPI not GPU-aware) then aborts on a modify of the other side\n"
        + "  k_buf_send_pair.clear_sync_state();\n"
        + "  k_buf_recv_pair.clear_sync_state();\n",
    },
    "src/KOKKOS/pair_mliap_kokkos.cpp": {
        INCLUDE: INCLUDE + '#include "comm_kokkos.h"\n',
        FORWARD_CALL: """  // copy_to is device memory: never the host pack of the legacy pair comm
  auto commKK = dynamic_cast<CommKokkos *>(comm);
  if (commKK && execution_space == Device) commKK->forward_comm_on_device(this);
  else comm->forward_comm(this);
""",
        REVERSE_CALL: """  auto commKK = dynamic_cast<CommKokkos *>(comm);
  if (commKK && execution_space == Device) commKK->reverse_comm_on_device(this);
  else comm->reverse_comm(this);
""",
    },
    "src/KOKKOS/mliap_data_kokkos.cpp": {
        PAIR_ARRAYS: PAIR_ARRAYS.replace(
            "  if (nneigh_max < npairs) {\n",
            "  if (nneigh_max < npairs) {\n"
            "    // a fifth more than this step needs: a pair count that keeps growing (a heating\n"
            "    // crystal) would otherwise reallocate, and zero-fill, every array on every step\n"
            "    const int nalloc = npairs + MIN(npairs / 5, MAXSMALLINT - npairs);\n",
        )
        .replace(", npairs,", ", nalloc,")
        .replace("nneigh_max = npairs;", "nneigh_max = nalloc;"),
    },
}

if __name__ == "__main__":
    apply(Path(sys.argv[1]), EDITS)
