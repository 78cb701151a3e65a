/* ----------------------------------------------------------------------
   nvalchemi-lammps: pairs from LAMMPS's neighbor list (see neighbor_pairs.h)
------------------------------------------------------------------------- */

#include "neighbor_pairs.h"

#include "lmptype.h"
#include "neigh_list.h"

using LAMMPS_NS::NeighList;

/* ---------------------------------------------------------------------- */

int NvalchemiLammps::listed_pair_count(const NeighList *list, int nreceivers)
{
  int count = 0;
  for (int ii = 0; ii < nreceivers; ii++) count += list->numneigh[list->ilist[ii]];
  return count;
}

/* ---------------------------------------------------------------------- */

int NvalchemiLammps::listed_pairs(const NeighList *list, int nreceivers, const int64_t *species,
                                  int64_t *pair_i, int64_t *pair_j)
{
  const int *ilist = list->ilist;
  const int *numneigh = list->numneigh;
  int **firstneigh = list->firstneigh;
  int npairs = 0;
  for (int ii = 0; ii < nreceivers; ii++) {
    const int i = ilist[ii];
    if (species[i] < 0) continue;
    const int *jlist = firstneigh[i];
    for (int jj = 0; jj < numneigh[i]; jj++) {
      const int j = jlist[jj] & NEIGHMASK;
      if (species[j] < 0) continue;
      pair_i[npairs] = i;
      pair_j[npairs] = j;
      npairs++;
    }
  }
  return npairs;
}

/* ---------------------------------------------------------------------- */

int NvalchemiLammps::pairs_within(double cutoff, const double *const *x,
                                  const int64_t *candidate_i, const int64_t *candidate_j,
                                  int ncandidates, int64_t *pair_i, int64_t *pair_j, double *rij)
{
  if (ncandidates == 0) return 0;
  const double cutsq = cutoff * cutoff;
  // contiguous rows of three, and local pointers: nothing reloaded after each store
  const double *const x0 = x[0];
  int npairs = 0;
  for (int k = 0; k < ncandidates; k++) {
    const int64_t i = candidate_i[k];
    const int64_t j = candidate_j[k];
    const double *xi = x0 + 3 * i;
    const double *xj = x0 + 3 * j;
    const double dx = xj[0] - xi[0];
    const double dy = xj[1] - xi[1];
    const double dz = xj[2] - xi[2];
    // written always, kept when inside: no branch for the ~30 % of candidates in the skin
    // to mispredict (slots npairs <= k < ncandidates exist)
    pair_i[npairs] = i;
    pair_j[npairs] = j;
    rij[3 * npairs + 0] = dx;
    rij[3 * npairs + 1] = dy;
    rij[3 * npairs + 2] = dz;
    npairs += dx * dx + dy * dy + dz * dz < cutsq ? 1 : 0;
  }
  return npairs;
}
