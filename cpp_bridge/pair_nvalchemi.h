/* -*- c++ -*- ----------------------------------------------------------
   nvalchemi-lammps: pair_style nvalchemi, a LAMMPS plugin that runs a
   machine-learned potential (torch, embedded Python) on each rank's owned
   and ghost atoms.
------------------------------------------------------------------------- */

#ifdef PAIR_CLASS
// clang-format off
PairStyle(nvalchemi,PairNvalchemi);
// clang-format on
#else

#ifndef LMP_PAIR_NVALCHEMI_H
#define LMP_PAIR_NVALCHEMI_H

#include "pair.h"

namespace NvalchemiLammps {
class PythonSession;
}

namespace LAMMPS_NS {

class PairNvalchemi : public Pair {
 public:
  PairNvalchemi(class LAMMPS *);
  ~PairNvalchemi() override;

  void compute(int, int) override;
  void settings(int, char **) override;
  void coeff(int, char **) override;
  void init_style() override;
  double init_one(int, int) override;
  double memory_usage() override;

  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;
  int pack_reverse_comm(int, int, double *) override;
  void unpack_reverse_comm(int, int *, double *) override;

  // LAMMPS communication of per-atom rows for the model (see python_bridge.h)
  void forward_exchange(double *rows, int width);
  void reverse_exchange(double *rows, int width);

 protected:
  NvalchemiLammps::PythonSession *session;
  double cutoff;    // the model's pair cutoff
  int layers;       // message-passing steps of the model (1 = strictly local)
  int shell;        // 1: ghost shell of layers x cutoff with ghost pairs, no exchange
  int *map;         // LAMMPS type -> model element index, -1 for NULL

  // the rows being exchanged: width values per atom, columns [offset, offset+count)
  double *exchange_rows;
  int exchange_width, exchange_offset, exchange_count;

  // per-step buffers handed to Python without copying
  int maxatom, maxpair;
  bigint *species;
  bigint *owner;    // owned row of each row, when local_exchange
  // from the last neighbor-list build: every listed pair (cutoff plus skin)
  bigint *candidate_i, *candidate_j;
  int ncandidates;
  bigint topology_stamp;    // neighbor->ncalls at that build
  int topology_ntotal;
  int local_exchange;       // every rank's ghosts are images of its own atoms
  bigint *pair_i, *pair_j;
  double *rij, *pair_forces, *atom_energies;
  double *atom_forces;        // 3 per owned and ghost atom, from non-pairwise terms
  double extra_virial[6];     // their virial beyond f.r

  void allocate();
  void grow_buffers(int natoms, int npairs);
  void build_topology();
  int pairs_in_cutoff();
};

}    // namespace LAMMPS_NS

#endif
#endif
