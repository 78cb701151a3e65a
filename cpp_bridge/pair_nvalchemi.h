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

 protected:
  NvalchemiLammps::PythonSession *session;
  double cutoff;    // the model's pair cutoff
  int *map;         // LAMMPS type -> model element index, -1 for NULL

  // per-step buffers handed to Python without copying
  int maxatom, maxpair;
  bigint *species;
  bigint *pair_i, *pair_j;
  double *rij, *pair_forces, *atom_energies;

  void allocate();
  void grow_buffers(int natoms, int npairs);
};

}    // namespace LAMMPS_NS

#endif
#endif
