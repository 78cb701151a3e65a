/* -*- c++ -*- ----------------------------------------------------------
   nvalchemi-lammps: the exchange plan of pair_style nvalchemi and
   nvalchemi/kk (strategy exchange), made at each neighbor-list build.
------------------------------------------------------------------------- */

#ifndef NVALCHEMI_EXCHANGE_PLAN_H
#define NVALCHEMI_EXCHANGE_PLAN_H

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace NvalchemiLammps {

// Where each row's exchanged values come from. A ghost of an atom owned here copies that
// atom's row (a gather on the model's device); a ghost of a remote atom copies one row
// received per distinct remote atom, so an exchange moves only those rows between ranks,
// in the model's precision.
class ExchangePlan {
 public:
  explicit ExchangePlan(MPI_Comm world) : world(world) {}

  // the plan from every row's origin (rank, owned row there: two values a row, ntotal
  // rows): source[k] is the row of [owned rows, received rows] that row k copies.
  // Collective.
  void build(const double *origin, int nlocal, int ntotal, int64_t *source);

  // rows between ranks, float64 or float32 (single): forward, the nsend() rows go out and
  // nrecv() rows come in; reverse, the other way round. Collective, the same width on
  // every rank.
  void transfer(const void *send, void *recv, int width, bool single, bool reverse) const;

  int nsend() const { return static_cast<int>(send_rows_.size()); }
  int nrecv() const { return nreceived; }
  // the owned rows other ranks receive, in the order they are sent
  const std::vector<int64_t> &send_rows() const { return send_rows_; }

 private:
  MPI_Comm world;
  std::vector<int64_t> send_rows_;
  std::vector<int> send_counts, recv_counts;    // rows to and from each rank
  int nreceived = 0;
};

}    // namespace NvalchemiLammps

#endif
