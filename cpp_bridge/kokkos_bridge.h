/* -*- c++ -*- ----------------------------------------------------------
   nvalchemi-lammps: the embedded-Python half of pair_style nvalchemi/kk.
   LAMMPS's device arrays reach torch as DLPack capsules (no copy); this
   header knows neither Python nor Kokkos: the pair style describes each
   array by pointer, device, dtype, shape and strides.
------------------------------------------------------------------------- */

#ifndef NVALCHEMI_KOKKOS_BRIDGE_H
#define NVALCHEMI_KOKKOS_BRIDGE_H

#include "python_bridge.h"

#include <cstdint>

namespace NvalchemiLammps {

class PythonSession;

// One array in LAMMPS's memory, described as DLPack describes it. A null data pointer
// with ndim 0 stands for "not given" (None on the Python side).
struct DeviceArray {
  // DLPack's codes: device kDLCPU = 1, kDLCUDA = 2; dtype kDLInt = 0, kDLFloat = 2
  static constexpr int CPU = 1, CUDA = 2;
  static constexpr int INT = 0, FLOAT = 2;
  void *data = nullptr;
  int device_type = CPU, device_id = 0;
  int code = FLOAT, bits = 64;
  int ndim = 0;
  int64_t shape[2] = {0, 0};
  int64_t strides[2] = {0, 0};    // in elements
};

// KOKKOS's communication as the model sees it, on (nrows, width) float64 arrays in the
// execution space's memory (rows as LAMMPS orders atoms: owned first, then ghosts);
// transfer() by the exchange plan of DeviceStep::owners, on host buffers
class DeviceCollectives : public PlanTransfer {
 public:
  virtual int ntotal() const = 0;
  // ghost rows take their owner's row (forward), or are summed into it and zeroed (reverse)
  virtual void exchange(double *rows, int nrows, int width, bool forward) = 0;
  // in-place sum over all ranks of host values
  virtual void allreduce(double *values, int count) = 0;
};

// One step on one rank: views of LAMMPS's arrays, valid during the call only.
struct DeviceStep {
  int nlocal, ntotal;
  DeviceArray positions;    // (ntotal, 3)
  DeviceArray tags;         // (ntotal,) atom IDs
  DeviceArray species;      // (ntotal,) int64 model element per atom, -1 for NULL types
  // the pairs within the cutoff: receivers in the list's order (owned atoms; with the
  // widened shell also ghosts), each one's neighbors in the list's order
  DeviceArray pair_i;       // (npairs,) int64 receiver rows
  DeviceArray pair_j;       // (npairs,) int64 neighbor rows
  DeviceArray rij;          // (npairs, 3) x_j - x_i
  DeviceArray forces;       // (ntotal, 3), added to
  DeviceArray atom_energies;    // (nlocal,), added to; not given without eflag_atom
  DeviceArray atom_virials;     // (ntotal, 6), added to; not given without vflag_atom
  bool pair_virial;             // the pairs' global virial wanted back (no f.r)
  bool global_virial;           // any global virial wanted (f.r, or the pairs')
  // LAMMPS reads nothing of this step on the host (no energy, virial, output, last step):
  // the model's energy and finiteness may then be read at the next step
  bool read_later;
  int64_t timestep;
  // the generation of the model's buffers (DeviceResult::sink) that this step's pairs
  // were also written into, each neighbor as its owned row; -1: not written there
  int64_t sink;
  // what a model that needs positions reads besides the pairs
  DeviceArray charges;    // (ntotal,), or not given
  double cell[9];         // lattice vectors as rows
  int periodic[3];
  // the only rank: every ghost is a periodic image of an atom owned here
  bool one_rank;
  // the exchange plan (strategy exchange, on the only rank, or on several when KOKKOS
  // stages pair communication through the host; not given otherwise): (ntotal,) int64,
  // the row of [owned rows, rows received by transfer()] each row copies, and on several
  // ranks (nsend,) int64 owned rows the others receive, and the count received
  DeviceArray owners;
  DeviceArray send_rows;
  int nrecv;
};

struct DeviceResult {
  double energy;       // this rank's energy
  double virial[6];    // xx yy zz xy xz yz: the pairs' (pair_virial) plus the non-pairwise part
  // the captured model's input buffers for the next step's pairs (one rank, ghosts folded
  // into their owners): int64 receiver and owned neighbor rows, float64 (capacity, 3)
  // vectors, int64 elements of the nlocal owned rows; generation -1: none
  struct {
    void *pair_i = nullptr, *pair_j = nullptr, *rij = nullptr, *species = nullptr;
    int64_t capacity = 0;
    int nlocal = -1;
    int64_t generation = -1;
  } sink;
};

// run the potential of `session` on one rank's step; errors come as PythonError
void compute_on_device(PythonSession &session, const DeviceStep &step, DeviceResult &result,
                       DeviceCollectives *collectives);

// the end of a run: the step left unread, if any, is read; errors come as PythonError
void finish_on_device(PythonSession &session);

}    // namespace NvalchemiLammps

#endif
