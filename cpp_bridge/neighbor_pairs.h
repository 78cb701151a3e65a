/* -*- c++ -*- ----------------------------------------------------------
   nvalchemi-lammps: the pairs pair_style nvalchemi gives the model, taken
   from LAMMPS's neighbor list.
------------------------------------------------------------------------- */

#ifndef NVALCHEMI_NEIGHBOR_PAIRS_H
#define NVALCHEMI_NEIGHBOR_PAIRS_H

#include <cstdint>

namespace LAMMPS_NS {
class NeighList;
}

namespace NvalchemiLammps {

// the pairs listed for the list's first nreceivers rows (an upper bound of what
// listed_pairs() writes)
int listed_pair_count(const LAMMPS_NS::NeighList *list, int nreceivers);

// every listed directed pair (i, j) of the first nreceivers rows between atoms of the
// model's elements (species >= 0), skin included, into pair_i, pair_j; their number
int listed_pairs(const LAMMPS_NS::NeighList *list, int nreceivers, const int64_t *species,
                 int64_t *pair_i, int64_t *pair_j);

// the candidates within cutoff, with rij = x_j - x_i, into pair_i, pair_j, rij; their
// number. x holds LAMMPS's positions (contiguous rows of three); every one of the
// ncandidates slots may be written.
int pairs_within(double cutoff, const double *const *x, const int64_t *candidate_i,
                 const int64_t *candidate_j, int ncandidates, int64_t *pair_i, int64_t *pair_j,
                 double *rij);

}    // namespace NvalchemiLammps

#endif
