/* ----------------------------------------------------------------------
   nvalchemi-lammps: the exchange plan (see exchange_plan.h)
------------------------------------------------------------------------- */

#include "exchange_plan.h"

#include <unordered_map>

using NvalchemiLammps::ExchangePlan;

/* ----------------------------------------------------------------------
   the plan from every row's origin: remote origins get one slot per
   distinct atom, numbered per rank, then ranks in order; each rank is told
   which of its atoms this one receives
------------------------------------------------------------------------- */

void ExchangePlan::build(const double *origin, int nlocal, int ntotal, int64_t *source)
{
  int me = 0, nprocs = 1;
  MPI_Comm_rank(world, &me);
  MPI_Comm_size(world, &nprocs);

  std::vector<std::unordered_map<int64_t, int>> slot(nprocs);
  std::vector<std::vector<int64_t>> wanted(nprocs);
  std::vector<int> from(ntotal, me);
  for (int k = 0; k < ntotal; k++) {
    const int rank = static_cast<int>(origin[2 * k]);
    const auto row = static_cast<int64_t>(origin[2 * k + 1]);
    if (rank == me) {
      source[k] = row;
      continue;
    }
    const auto added = slot[rank].emplace(row, static_cast<int>(wanted[rank].size()));
    if (added.second) wanted[rank].push_back(row);
    source[k] = added.first->second;
    from[k] = rank;
  }
  std::vector<int> first(nprocs + 1, 0);
  recv_counts.assign(nprocs, 0);
  for (int r = 0; r < nprocs; r++) {
    recv_counts[r] = static_cast<int>(wanted[r].size());
    first[r + 1] = first[r] + recv_counts[r];
  }
  nreceived = first[nprocs];
  for (int k = 0; k < ntotal; k++)
    if (from[k] != me) source[k] += nlocal + first[from[k]];

  send_counts.assign(nprocs, 0);
  MPI_Alltoall(recv_counts.data(), 1, MPI_INT, send_counts.data(), 1, MPI_INT, world);
  std::vector<int64_t> requests;
  requests.reserve(nreceived);
  for (int r = 0; r < nprocs; r++) requests.insert(requests.end(), wanted[r].begin(), wanted[r].end());
  std::vector<int> send_first(nprocs + 1, 0);
  for (int r = 0; r < nprocs; r++) send_first[r + 1] = send_first[r] + send_counts[r];
  send_rows_.assign(send_first[nprocs], 0);
  MPI_Alltoallv(requests.data(), recv_counts.data(), first.data(), MPI_INT64_T,
                send_rows_.data(), send_counts.data(), send_first.data(), MPI_INT64_T, world);
}

/* ----------------------------------------------------------------------
   rows between ranks by the plan, float64 or float32 (single)
------------------------------------------------------------------------- */

void ExchangePlan::transfer(const void *send, void *recv, int width, bool single,
                            bool reverse) const
{
  int nprocs = 1;
  MPI_Comm_size(world, &nprocs);
  const std::vector<int> &out = reverse ? recv_counts : send_counts;
  const std::vector<int> &in = reverse ? send_counts : recv_counts;
  std::vector<int> sendcounts(nprocs), sdispls(nprocs), recvcounts(nprocs), rdispls(nprocs);
  int sent = 0, received = 0;
  for (int r = 0; r < nprocs; r++) {
    sendcounts[r] = out[r] * width;
    recvcounts[r] = in[r] * width;
    sdispls[r] = sent;
    rdispls[r] = received;
    sent += sendcounts[r];
    received += recvcounts[r];
  }
  const MPI_Datatype type = single ? MPI_FLOAT : MPI_DOUBLE;
  MPI_Alltoallv(send, sendcounts.data(), sdispls.data(), type, recv, recvcounts.data(),
                rdispls.data(), type, world);
}
