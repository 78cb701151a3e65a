/* ----------------------------------------------------------------------
   nvalchemi-lammps: pair_style nvalchemi/kk

   The KOKKOS variant of pair_style nvalchemi: same keywords, model files,
   checks and messages (it is a PairNvalchemi), but each step's data stays in
   the execution space's memory. Each step, Kokkos kernels here take the
   pairs within the model's cutoff from the KOKKOS full neighbor list (cutoff
   plus skin) with their rij, and the model's element of each atom; they,
   positions and atom IDs go to the model as DLPack views (kDLCPU on a host
   space, kDLCUDA on a GPU), and the model adds its forces (per-atom energies
   and virials when asked) into LAMMPS's device arrays. Ghost features move
   by pair_style nvalchemi's exchange plan, made at each neighbor-list build
   (build_plan), wherever KOKKOS's pair communication does more: on a single
   rank every ghost is a periodic image of an owned atom, and the model
   gathers (forward) and sums (reverse) rows by owned row in one kernel per
   exchange, instead of a pack and an unpack per swap (and, with MPI not
   GPU-aware, a copy of KOKKOS's whole pair buffer to the host at each swap
   of a reverse exchange); on several ranks, when KOKKOS stages pair
   communication through the host (MPI not GPU-aware), only the rows of
   remote atoms cross, once each, in the model's precision, instead of every
   row as float64 both ways. Otherwise (several ranks, MPI GPU-aware) ghost
   features go through KOKKOS's pair communication with device buffers.

   Synchronization: LAMMPS's kernels (and the exchanges') run on Kokkos's
   default instance, a blocking CUDA stream that CUDA orders both ways against
   torch's default (legacy) stream, so nothing is fenced here: the host keeps
   launching while the GPU works. The Python side synchronizes only when torch
   runs on another stream (nvalchemi_lammps/frontends/_streams.py).
------------------------------------------------------------------------- */

#include "pair_nvalchemi_kokkos.h"

#include "atom_kokkos.h"
#include "atom_masks.h"
#include "comm.h"
#include "comm_kokkos.h"
#include "domain.h"
#include "error.h"
#include "force.h"
#include "kokkos.h"
#include "memory_kokkos.h"
#include "neigh_list_kokkos.h"
#include "neigh_request.h"
#include "neighbor.h"
#include "output.h"
#include "update.h"
#include "utils.h"

#include "exchange_plan.h"
#include "kokkos_bridge.h"
#include "python_bridge.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace LAMMPS_NS;
using NvalchemiLammps::DeviceArray;
using NvalchemiLammps::DeviceCollectives;

// Values per atom in one forward/reverse communication (as PairNvalchemi): LAMMPS's host
// path sizes its buffers from comm_forward/comm_reverse at init; wider rows go in rounds.
static constexpr int EXCHANGE_CHUNK = 64;

namespace {

// DLPack's description of a Kokkos view of this execution space
template <class DeviceType, class View>
DeviceArray describe(const View &view, int64_t rows = -1)
{
  using value_type = typename View::non_const_value_type;
  DeviceArray array;
  array.data = const_cast<value_type *>(view.data());
  array.device_type = DeviceArray::CPU;
  array.device_id = 0;
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (!std::is_same_v<typename DeviceType::memory_space, Kokkos::HostSpace>) {
    array.device_type = DeviceArray::CUDA;
    array.device_id = typename DeviceType::execution_space().cuda_device();
  }
#endif
  array.code = std::is_floating_point_v<value_type> ? DeviceArray::FLOAT : DeviceArray::INT;
  array.bits = static_cast<int>(8 * sizeof(value_type));
  array.ndim = static_cast<int>(View::rank);
  for (int d = 0; d < array.ndim; d++) {
    array.shape[d] = static_cast<int64_t>(view.extent(d));
    array.strides[d] = static_cast<int64_t>(view.stride(d));
  }
  if (rows >= 0) array.shape[0] = std::min<int64_t>(rows, array.shape[0]);
  return array;
}

// whether the jj-th neighbor of list row i is one of the step's pairs (both atoms of the
// model's elements, closer than the cutoff): then its row j and d = x_j - x_i
template <class Neighbors, class Positions, class Species> struct IsPair {
  Neighbors neighbors;
  Positions pos;
  Species species;
  double cutsq;

  KOKKOS_INLINE_FUNCTION bool operator()(const int i, const int jj, int &j, double d[3]) const
  {
    j = neighbors(i, jj) & NEIGHMASK;
    if (species(j) < 0) return false;
    d[0] = pos(j, 0) - pos(i, 0);
    d[1] = pos(j, 1) - pos(i, 1);
    d[2] = pos(j, 2) - pos(i, 2);
    return d[0] * d[0] + d[1] * d[1] + d[2] * d[2] < cutsq;
  }
};

// the pair style's KOKKOS communication, as the model's collectives
template <class DeviceType> class KokkosCollectives : public DeviceCollectives {
 public:
  KokkosCollectives(PairNvalchemiKokkos<DeviceType> *pair, Atom *atom, MPI_Comm world) :
      pair(pair), atom(atom), world(world)
  {
  }
  int ntotal() const override { return atom->nlocal + atom->nghost; }
  void exchange(double *rows, int nrows, int width, bool forward) override
  {
    pair->exchange_on_device(rows, nrows, width, forward);
  }
  int nsend() const override { return pair->plan().nsend(); }
  int nrecv() const override { return pair->plan().nrecv(); }
  void transfer(const void *send, void *recv, int width, bool single, bool reverse) override
  {
    pair->plan().transfer(send, recv, width, single, reverse);
  }
  void allreduce(double *values, int count) override
  {
    MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_SUM, world);
  }

 private:
  PairNvalchemiKokkos<DeviceType> *pair;
  Atom *atom;
  MPI_Comm world;
};

}    // namespace

/* ---------------------------------------------------------------------- */

template <class DeviceType>
PairNvalchemiKokkos<DeviceType>::PairNvalchemiKokkos(LAMMPS *lmp) : PairNvalchemi(lmp)
{
  kokkosable = 1;
  atomKK = (AtomKokkos *) atom;
  execution_space = ExecutionSpaceFromDevice<DeviceType>::space;
  datamask_read = X_MASK | F_MASK | TYPE_MASK | TAG_MASK | ENERGY_MASK | VIRIAL_MASK;
  datamask_modify = F_MASK | ENERGY_MASK | VIRIAL_MASK;
  reverse_comm_device = 1;
}

/* ---------------------------------------------------------------------- */

template <class DeviceType> PairNvalchemiKokkos<DeviceType>::~PairNvalchemiKokkos()
{
  if (copymode) return;
  memoryKK->destroy_kokkos(k_eatom, eatom);
  memoryKK->destroy_kokkos(k_vatom, vatom);
}

/* ---------------------------------------------------------------------- */

template <class DeviceType> void PairNvalchemiKokkos<DeviceType>::compute(int eflag, int vflag)
{
  ev_init(eflag, vflag, 0);

  // per-atom energies and virials live in the execution space (k_eatom, k_vatom)
  if (eflag_atom) {
    if ((int) k_eatom.view_host().extent(0) < maxeatom) {
      memoryKK->destroy_kokkos(k_eatom, eatom);
      memoryKK->create_kokkos(k_eatom, eatom, maxeatom, "pair:eatom");
    }
    Kokkos::deep_copy(k_eatom.template view<DeviceType>(), 0.0);
    k_eatom.template modify<DeviceType>();
  }
  if (vflag_atom) {
    if ((int) k_vatom.view_host().extent(0) < maxvatom) {
      memoryKK->destroy_kokkos(k_vatom, vatom);
      memoryKK->create_kokkos(k_vatom, vatom, maxvatom, 6, "pair:vatom");
    }
    Kokkos::deep_copy(k_vatom.template view<DeviceType>(), 0.0);
    k_vatom.template modify<DeviceType>();
  }

  const bool charged = session->needs_positions() && atom->q_flag;
  atomKK->sync(execution_space, X_MASK | F_MASK | TYPE_MASK | TAG_MASK | (charged ? Q_MASK : 0));
  k_map.template sync<DeviceType>();
  x = atomKK->k_x.view<DeviceType>();
  f = atomKK->k_f.view<DeviceType>();
  auto tag = atomKK->k_tag.view<DeviceType>();
  auto *k_list = static_cast<NeighListKokkos<DeviceType> *>(list);

  const int nlocal = atom->nlocal;
  const int ntotal = nlocal + atom->nghost;

  NvalchemiLammps::DeviceStep step{};
  step.nlocal = nlocal;
  step.ntotal = ntotal;
  if (uses_plan()) {
    // ghosts change only at a neighbor-list build (a run's setup too), on every rank at
    // once: making the plan is collective
    if (neighbor->ncalls != plan_built)
      build_plan(nlocal, ntotal);
    else if (ntotal != plan_ntotal)
      error->one(FLERR, "Pair style nvalchemi/kk: the ghost atoms changed without a "
                        "neighbor-list build");
    step.owners = describe<DeviceType>(d_owners, ntotal);
    step.send_rows = describe<DeviceType>(d_send_rows, plan().nsend());
    step.nrecv = plan().nrecv();
  }
  const int nreceivers = shell ? k_list->inum + k_list->gnum : k_list->inum;
  const int64_t npairs = build_pairs(nreceivers, ntotal);
  step.sink = sink_written;
  step.positions = describe<DeviceType>(x, ntotal);
  step.tags = describe<DeviceType>(tag, ntotal);
  step.species = describe<DeviceType>(d_species, ntotal);
  step.pair_i = describe<DeviceType>(d_pair_i, npairs);
  step.pair_j = describe<DeviceType>(d_pair_j, npairs);
  step.rij = describe<DeviceType>(d_rij, npairs);
  step.forces = describe<DeviceType>(f, ntotal);
  if (eflag_atom) step.atom_energies = describe<DeviceType>(k_eatom.template view<DeviceType>(), nlocal);
  if (vflag_atom) step.atom_virials = describe<DeviceType>(k_vatom.template view<DeviceType>(), ntotal);
  step.pair_virial = vflag_global && !vflag_fdotr;
  step.global_virial = vflag_global || vflag_fdotr;    // ev_setup clears one for the other
  // a step of dynamics whose energy, virial and output nobody reads on the host (thermo,
  // dumps and restarts are outputs, the run's last step is one): the model's finiteness
  // is read at the next step, when the GPU has long finished this one, instead of
  // keeping the host waiting now (a step that is not finite still writes nothing)
  step.read_later = update->whichflag == 1 && !eflag_either && !vflag_either && !vflag_fdotr &&
      update->ntimestep < output->next && update->ntimestep < update->laststep;
  step.timestep = update->ntimestep;
  step.one_rank = comm->nprocs == 1;
  if (session->needs_positions()) {
    if (charged) step.charges = describe<DeviceType>(atomKK->k_q.view<DeviceType>(), ntotal);
    const double *h = domain->h;    // xprd yprd zprd yz xz xy
    const double cell[9] = {h[0], 0.0, 0.0, h[5], h[1], 0.0, h[4], h[3], h[2]};
    std::copy(cell, cell + 9, step.cell);
    step.periodic[0] = domain->xperiodic;
    step.periodic[1] = domain->yperiodic;
    step.periodic[2] = domain->zperiodic;
  }

  NvalchemiLammps::DeviceResult result{};
  KokkosCollectives<DeviceType> collectives(this, atom, world);
  try {
    NvalchemiLammps::compute_on_device(*session, step, result, &collectives);
    set_sink(result);
  } catch (std::exception &err) {
    // rank-local failure: error->one aborts every rank instead of leaving the
    // others waiting in the next collective
    log_traceback(err);
    abort_one(FLERR, fmt::format("Pair style nvalchemi/kk failed at step {}: {}",
                                 update->ntimestep, with_type(err)));
  }

  atomKK->modified(execution_space, F_MASK);
  if (eflag_global) eng_vdwl += result.energy;
  if (eflag_atom) {
    k_eatom.template modify<DeviceType>();
    k_eatom.sync_host();
  }
  if (vflag_atom) {
    k_vatom.template modify<DeviceType>();
    k_vatom.sync_host();
  }
  // KOKKOS's f.r sets the virial (Pair's adds to it): then the pairs' virial when f.r is
  // not used, or the part f.r misses (non-pairwise terms)
  if (vflag_fdotr) pair_virial_fdotr_compute(this);
  if (step.global_virial)
    for (int k = 0; k < 6; k++) virial[k] += result.virial[k];
}

/* ----------------------------------------------------------------------
   end of a run: a step LAMMPS read nothing of is read now when no step came
   after it (fix halt, timer timeout), then the capture report
------------------------------------------------------------------------- */

template <class DeviceType> void PairNvalchemiKokkos<DeviceType>::finish()
{
  if (session) {
    try {
      NvalchemiLammps::finish_on_device(*session);
    } catch (std::exception &err) {
      log_traceback(err);
      abort_one(FLERR, fmt::format("Pair style nvalchemi/kk failed at the end of the run "
                                   "(step {}): {}",
                                   update->ntimestep, with_type(err)));
    }
  }
  PairNvalchemi::finish();
}

/* ----------------------------------------------------------------------
   the captured model's input buffers the model handed back (or none): the
   next step's pairs are written there too when they fit
------------------------------------------------------------------------- */

template <class DeviceType>
void PairNvalchemiKokkos<DeviceType>::set_sink(const NvalchemiLammps::DeviceResult &result)
{
  const auto &given = result.sink;
  sink = Sink();
  if (given.generation < 0) return;
  sink.pair_i = t_index_unmanaged(static_cast<int64_t *>(given.pair_i), given.capacity);
  sink.pair_j = t_index_unmanaged(static_cast<int64_t *>(given.pair_j), given.capacity);
  sink.rij = t_vectors_unmanaged(static_cast<double *>(given.rij), given.capacity);
  sink.species = t_index_unmanaged(static_cast<int64_t *>(given.species), given.nlocal);
  sink.capacity = given.capacity;
  sink.nlocal = given.nlocal;
  sink.generation = given.generation;
}

/* ----------------------------------------------------------------------
   the pairs of this step: every (i, j) of the full list with i one of the
   first nreceivers list rows, both atoms of the model's elements (NULL types
   of pair_style hybrid are not) and |x_j - x_i| below the model's cutoff, in
   the list's order, with rij = x_j - x_i as pair_style nvalchemi computes it
   on the host; and the model's element of every atom (-1 for NULL). Counted,
   scanned, then filled: one count read back, the arrays grown (never shrunk)
   only when a step has more pairs than any before. One team per list row
   goes through its neighbors (a warp on a GPU: a row has ~100-200 within
   cutoff plus skin, and a thread per row would leave most of the GPU idle
   below ~10^5 atoms while walking them one by one), counting them, then
   placing each pair by its rank within the row (a scan over the team).
------------------------------------------------------------------------- */

template <class DeviceType>
int64_t PairNvalchemiKokkos<DeviceType>::build_pairs(int nreceivers, int ntotal)
{
  auto *k_list = static_cast<NeighListKokkos<DeviceType> *>(list);
  auto ilist = k_list->d_ilist;
  auto numneigh = k_list->d_numneigh;
  auto type = atomKK->k_type.view<DeviceType>();
  auto map = k_map.template view<DeviceType>();
  const double cutsq = session->cutoff() * session->cutoff();

  if ((int) d_species.extent(0) < ntotal) {
    d_species = t_index();
    d_species = t_index(Kokkos::view_alloc(Kokkos::WithoutInitializing, "nvalchemi:species"),
                        atom->nmax);
  }
  if ((int) d_counts.extent(0) < nreceivers) {
    d_counts = t_index();
    d_counts = t_index(Kokkos::view_alloc(Kokkos::WithoutInitializing, "nvalchemi:counts"),
                       atom->nmax);
  }
  auto species = d_species;
  auto counts = d_counts;
  // the model's own buffers (one rank, ghosts folded): the elements of the owned rows too
  const int nlocal = atom->nlocal;
  const bool to_sink = sink.generation >= 0 && nlocal == sink.nlocal && comm->nprocs == 1 &&
      !shell && uses_plan() && plan_built == neighbor->ncalls;
  auto sink_species = sink.species;
  Kokkos::parallel_for(
      Kokkos::RangePolicy<DeviceType>(0, ntotal), KOKKOS_LAMBDA(const int i) {
        species(i) = map(type(i));
        if (to_sink && i < nlocal) sink_species(i) = species(i);
      });

  const IsPair<decltype(k_list->d_neighbors), decltype(x), t_index> is_pair{
      k_list->d_neighbors, x, species, cutsq};
  using team_policy = Kokkos::TeamPolicy<DeviceType>;
  using member = typename team_policy::member_type;
  const int team_size = execution_space == HostKK ? 1 : 32;
  Kokkos::parallel_for(
      team_policy(nreceivers, team_size), KOKKOS_LAMBDA(const member &team) {
        const int ii = team.league_rank();
        const int i = ilist(ii);
        int64_t n = 0;
        if (species(i) >= 0)
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, numneigh(i)),
              [&](const int jj, int64_t &sum) {
                int j;
                double d[3];
                if (is_pair(i, jj, j, d)) sum++;
              },
              n);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { counts(ii) = n; });
      });
  int64_t npairs = 0;
  Kokkos::parallel_scan(
      Kokkos::RangePolicy<DeviceType>(0, nreceivers),
      KOKKOS_LAMBDA(const int ii, int64_t &first, const bool final) {
        const int64_t n = counts(ii);
        if (final) counts(ii) = first;    // each row read, then written, by its own call
        first += n;
      },
      npairs);

  if ((int64_t) d_pair_i.extent(0) < npairs) {
    const int64_t capacity = npairs + npairs / 16;    // room for the count to drift up
    d_pair_i = t_index();    // the old arrays go before the new ones are made
    d_pair_j = t_index();
    d_rij = t_vectors();
    auto alloc = [](const char *label) {
      return Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label));
    };
    d_pair_i = t_index(alloc("nvalchemi:pair_i"), capacity);
    d_pair_j = t_index(alloc("nvalchemi:pair_j"), capacity);
    d_rij = t_vectors(alloc("nvalchemi:rij"), capacity);
  }
  auto pair_i = d_pair_i;
  auto pair_j = d_pair_j;
  auto rij = d_rij;
  // and into the model's buffers when they hold them (each neighbor as its owned row)
  const bool into_sink = to_sink && npairs <= sink.capacity;
  sink_written = into_sink ? sink.generation : -1;
  auto owners = d_owners;
  auto sink_i = sink.pair_i;
  auto sink_j = sink.pair_j;
  auto sink_rij = sink.rij;
  Kokkos::parallel_for(
      team_policy(nreceivers, team_size), KOKKOS_LAMBDA(const member &team) {
        const int ii = team.league_rank();
        const int i = ilist(ii);
        if (species(i) < 0) return;    // the whole team: no pairs
        const int64_t first = counts(ii);
        Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, numneigh(i)),
                              [&](const int jj, int64_t &rank, const bool final) {
                                int j;
                                double d[3];
                                if (!is_pair(i, jj, j, d)) return;
                                if (final) {
                                  const int64_t k = first + rank;
                                  pair_i(k) = i;
                                  pair_j(k) = j;
                                  rij(k, 0) = d[0];
                                  rij(k, 1) = d[1];
                                  rij(k, 2) = d[2];
                                  if (into_sink) {
                                    sink_i(k) = i;
                                    sink_j(k) = owners(j);
                                    sink_rij(k, 0) = d[0];
                                    sink_rij(k, 1) = d[1];
                                    sink_rij(k, 2) = d[2];
                                  }
                                }
                                rank++;
                              });
      });
  return npairs;
}

/* ----------------------------------------------------------------------
   the exchanges go by the exchange plan (strategy exchange) on one rank, and
   on several when KOKKOS stages pair communication through the host: the
   same answer on every rank (LAMMPS's settings, the environment)
------------------------------------------------------------------------- */

template <class DeviceType> bool PairNvalchemiKokkos<DeviceType>::uses_plan() const
{
  const bool host_comm =
      lmp->kokkos->forward_pair_comm_legacy || lmp->kokkos->reverse_pair_comm_legacy;
  return session->uses_exchange() && plan_exchange && (comm->nprocs == 1 || host_comm);
}

/* ----------------------------------------------------------------------
   the exchange plan (ExchangePlan::build) into d_owners and
   d_send_rows: every row's origin (rank, owned row there) carried to the
   ghosts by one forward exchange, as positions travel (through intermediate
   ghosts). On one rank that is the whole plan, made on the device.
------------------------------------------------------------------------- */

template <class DeviceType>
void PairNvalchemiKokkos<DeviceType>::build_plan(int nlocal, int ntotal)
{
  if ((int) d_owners.extent(0) < ntotal) {
    d_owners = t_index();
    d_owners = t_index(Kokkos::view_alloc(Kokkos::WithoutInitializing, "nvalchemi:owners"),
                       atom->nmax);
  }
  Kokkos::View<double *[2], Kokkos::LayoutRight, DeviceType> origin(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "nvalchemi:origin"), std::max(ntotal, 1));
  const double me = comm->me;
  Kokkos::parallel_for(
      Kokkos::RangePolicy<DeviceType>(0, nlocal), KOKKOS_LAMBDA(const int i) {
        origin(i, 0) = me;
        origin(i, 1) = i;
      });
  if (ntotal > nlocal) exchange_on_device(origin.data(), ntotal, 2, true);
  if (comm->nprocs == 1) {
    auto owners = d_owners;
    Kokkos::parallel_for(
        Kokkos::RangePolicy<DeviceType>(0, ntotal),
        KOKKOS_LAMBDA(const int k) { owners(k) = static_cast<int64_t>(origin(k, 1)); });
  } else {
    typedef Kokkos::View<int64_t *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> t_host_index;
    auto h_origin = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), origin);
    std::vector<bigint> source(std::max(ntotal, 1));
    plan().build(h_origin.data(), nlocal, ntotal, source.data());
    const std::vector<int64_t> &send_rows = plan().send_rows();
    Kokkos::deep_copy(Kokkos::subview(d_owners, std::make_pair(0, ntotal)),
                      t_host_index(source.data(), ntotal));
    if ((int64_t) d_send_rows.extent(0) < (int64_t) send_rows.size())
      d_send_rows = t_index(Kokkos::view_alloc(Kokkos::WithoutInitializing, "nvalchemi:send"),
                            send_rows.size() + send_rows.size() / 4);
    Kokkos::deep_copy(Kokkos::subview(d_send_rows, std::make_pair(size_t(0), send_rows.size())),
                      Kokkos::View<const int64_t *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                          send_rows.data(), send_rows.size()));
  }
  plan_built = neighbor->ncalls;
  plan_ntotal = ntotal;
}

/* ----------------------------------------------------------------------
   the model runs where KOKKOS runs: on a GPU, the one holding this rank's
   arrays (Kokkos's choice under -k on g N), unless device names one
------------------------------------------------------------------------- */

template <class DeviceType>
std::string PairNvalchemiKokkos<DeviceType>::model_device(const std::string &given) const
{
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (!std::is_same_v<typename DeviceType::memory_space, Kokkos::HostSpace>) {
    if (given.empty() || given == "cuda")
      return "cuda:" + std::to_string(typename DeviceType::execution_space().cuda_device());
  }
#endif
  return PairNvalchemi::model_device(given);
}

/* ----------------------------------------------------------------------
   set coeffs as pair_style nvalchemi does, and the type map on the device
------------------------------------------------------------------------- */

template <class DeviceType> void PairNvalchemiKokkos<DeviceType>::coeff(int narg, char **arg)
{
  PairNvalchemi::coeff(narg, arg);
  const int np1 = atom->ntypes + 1;
  k_map = DAT::tdual_int_1d("pair:map", np1);
  for (int i = 0; i < np1; i++) k_map.view_host()(i) = map[i];
  k_map.modify_host();
  k_map.template sync<DeviceType>();
}

/* ----------------------------------------------------------------------
   init specific to this pair style: pair_style nvalchemi's checks, and the
   full neighbor list built by KOKKOS in this execution space
------------------------------------------------------------------------- */

template <class DeviceType> void PairNvalchemiKokkos<DeviceType>::init_style()
{
  // NVALCHEMI_LAMMPS_EXCHANGE=comm: every exchange through KOKKOS's communication, where
  // the exchange plan would be used (to compare the two); read before pair_style
  // nvalchemi's checks, which compare it across ranks
  const char *exchange = std::getenv("NVALCHEMI_LAMMPS_EXCHANGE");
  const std::string mode = exchange ? exchange : "gather";
  if (mode != "gather" && mode != "comm")
    error->all(FLERR, "Pair style nvalchemi/kk: NVALCHEMI_LAMMPS_EXCHANGE must be gather or "
                      "comm, not '{}'", mode);
  plan_exchange = mode == "gather";
  PairNvalchemi::init_style();
  plan_built = -1;
  sink = Sink();    // pair_style may have replaced the model (and freed its buffers)
  if (comm->me == 0 && !exchange_reported && session->uses_exchange()) {
    std::string how = "through KOKKOS's pair communication";
    if (uses_plan())
      how = comm->nprocs == 1 ? "gathered from the atoms they image (one rank)"
                              : "by the exchange plan: remote atoms' rows once each, "
                                "through the host";
    utils::logmesg(lmp, "pair_style nvalchemi/kk: ghost features {}\n", how);
    exchange_reported = true;
  }
  auto request = neighbor->find_request(this);
  request->set_kokkos_host(std::is_same_v<DeviceType, LMPHostType> &&
                           !std::is_same_v<DeviceType, LMPDeviceType>);
  request->set_kokkos_device(std::is_same_v<DeviceType, LMPDeviceType>);
}

/* ----------------------------------------------------------------------
   pair_style nvalchemi's settings compared across ranks, and how ghost
   features are exchanged: by the plan on some ranks and through KOKKOS's
   communication on others would hang
------------------------------------------------------------------------- */

template <class DeviceType>
std::vector<std::pair<std::string, std::string>>
PairNvalchemiKokkos<DeviceType>::compared_settings() const
{
  auto settings = PairNvalchemi::compared_settings();
  settings.emplace_back("NVALCHEMI_LAMMPS_EXCHANGE", plan_exchange ? "gather" : "comm");
  return settings;
}

/* ----------------------------------------------------------------------
   exchange of per-atom rows in the execution space's memory: forward, ghost
   rows take their owner's row; reverse, ghost rows are added to their
   owner's (through intermediate ghosts, as LAMMPS folds forces), then zeroed.
   KOKKOS's device path packs and unpacks on the device; when KOKKOS takes its
   host path for pair communication (MPI not GPU-aware on several ranks,
   docs/gpus.md), the rows are staged through a host copy (none for a host
   execution space, whose memory is the host's).
------------------------------------------------------------------------- */

template <class DeviceType>
void PairNvalchemiKokkos<DeviceType>::exchange_on_device(double *rows, int nrows, int width,
                                                         bool forward)
{
  const size_t count = static_cast<size_t>(nrows) * width;
  d_rows = t_rows(rows, count);
  const bool legacy = forward ? lmp->kokkos->forward_pair_comm_legacy
                              : lmp->kokkos->reverse_pair_comm_legacy;
  const bool host_memory = std::is_same_v<typename DeviceType::memory_space, Kokkos::HostSpace>;
  typename t_rows::host_mirror_type h_rows;
  if (legacy && !host_memory) {
    h_rows = Kokkos::create_mirror_view(d_rows);
    Kokkos::deep_copy(h_rows, d_rows);
    exchange_rows = h_rows.data();
  } else
    exchange_rows = rows;
  // LAMMPS sends a pair style of a host execution space through its host path; in a
  // LAMMPS whose KOKKOS device is the host (Serial, OpenMP) the rows are in that memory
  // either way, so KOKKOS's device path (the pack/unpack kernels below, as on a GPU) runs
  // unless KOKKOS chose the host path (comm/pair/forward host, ...)
  auto *commKK = dynamic_cast<CommKokkos *>(comm);
  const bool host_device = std::is_same_v<DeviceType, LMPDeviceType> &&
      ExecutionSpaceFromDevice<DeviceType>::space == HostKK;
  const bool direct = commKK && host_device && !legacy;
  exchange_width = width;
  for (exchange_offset = 0; exchange_offset < width; exchange_offset += EXCHANGE_CHUNK) {
    exchange_count = std::min(EXCHANGE_CHUNK, width - exchange_offset);
    if (direct && forward)
      commKK->forward_comm_device<LMPDeviceType>(this, exchange_count);
    else if (direct)
      commKK->reverse_comm_device<LMPDeviceType>(this, exchange_count);
    else if (forward)
      comm->forward_comm(this, exchange_count);
    else
      comm->reverse_comm(this, exchange_count);
  }
  if (legacy && !host_memory) Kokkos::deep_copy(d_rows, h_rows);
  if (!forward) {
    auto d = d_rows;
    const size_t first = static_cast<size_t>(atom->nlocal) * width;
    Kokkos::parallel_for(
        Kokkos::RangePolicy<DeviceType>(first, count), KOKKOS_LAMBDA(const size_t k) { d(k) = 0.0; });
  }
  exchange_rows = nullptr;
  d_rows = t_rows();
}

/* ---------------------------------------------------------------------- */

template <class DeviceType>
int PairNvalchemiKokkos<DeviceType>::pack_forward_comm_kokkos(int n, DAT::tdual_int_1d k_sendlist,
                                                             DAT::tdual_double_1d &k_buf,
                                                             int /*pbc_flag*/, int * /*pbc*/)
{
  auto sendlist = k_sendlist.view<DeviceType>();
  auto buf = k_buf.view<DeviceType>();
  auto rows = d_rows;
  const int width = exchange_width, offset = exchange_offset, per = exchange_count;
  Kokkos::parallel_for(
      Kokkos::RangePolicy<DeviceType>(0, n), KOKKOS_LAMBDA(const int ii) {
        const size_t row = static_cast<size_t>(sendlist(ii)) * width + offset;
        for (int k = 0; k < per; k++) buf(static_cast<size_t>(ii) * per + k) = rows(row + k);
      });
  return n * per;
}

/* ---------------------------------------------------------------------- */

template <class DeviceType>
void PairNvalchemiKokkos<DeviceType>::unpack_forward_comm_kokkos(int n, int first,
                                                                DAT::tdual_double_1d &k_buf)
{
  auto buf = k_buf.view<DeviceType>();
  auto rows = d_rows;
  const int width = exchange_width, offset = exchange_offset, per = exchange_count;
  Kokkos::parallel_for(
      Kokkos::RangePolicy<DeviceType>(0, n), KOKKOS_LAMBDA(const int ii) {
        const size_t row = static_cast<size_t>(first + ii) * width + offset;
        for (int k = 0; k < per; k++) rows(row + k) = buf(static_cast<size_t>(ii) * per + k);
      });
}

/* ---------------------------------------------------------------------- */

template <class DeviceType>
int PairNvalchemiKokkos<DeviceType>::pack_reverse_comm_kokkos(int n, int first,
                                                             DAT::tdual_double_1d &k_buf)
{
  auto buf = k_buf.view<DeviceType>();
  auto rows = d_rows;
  const int width = exchange_width, offset = exchange_offset, per = exchange_count;
  Kokkos::parallel_for(
      Kokkos::RangePolicy<DeviceType>(0, n), KOKKOS_LAMBDA(const int ii) {
        const size_t row = static_cast<size_t>(first + ii) * width + offset;
        for (int k = 0; k < per; k++) buf(static_cast<size_t>(ii) * per + k) = rows(row + k);
      });
  return n * per;
}

/* ----------------------------------------------------------------------
   an atom appears at most once in one swap's send list, so the sums of one
   swap do not race (as in LAMMPS's own KOKKOS reverse communication)
------------------------------------------------------------------------- */

template <class DeviceType>
void PairNvalchemiKokkos<DeviceType>::unpack_reverse_comm_kokkos(int n, DAT::tdual_int_1d k_sendlist,
                                                                DAT::tdual_double_1d &k_buf)
{
  auto sendlist = k_sendlist.view<DeviceType>();
  auto buf = k_buf.view<DeviceType>();
  auto rows = d_rows;
  const int width = exchange_width, offset = exchange_offset, per = exchange_count;
  Kokkos::parallel_for(
      Kokkos::RangePolicy<DeviceType>(0, static_cast<size_t>(n) * per),
      KOKKOS_LAMBDA(const size_t m) {
        const size_t ii = m / per, k = m % per;
        rows(static_cast<size_t>(sendlist(ii)) * width + offset + k) += buf(m);
      });
}

/* ----------------------------------------------------------------------
   factories for the plugin's registration (nvalchemiplugin.cpp)
------------------------------------------------------------------------- */

namespace NvalchemiLammps {
Pair *create_pair_kokkos_device(LAMMPS *lmp)
{
  return new PairNvalchemiKokkos<LMPDeviceType>(lmp);
}
Pair *create_pair_kokkos_host(LAMMPS *lmp)
{
  return new PairNvalchemiKokkos<LMPHostType>(lmp);
}
}    // namespace NvalchemiLammps

namespace LAMMPS_NS {
template class PairNvalchemiKokkos<LMPDeviceType>;
#ifdef LMP_KOKKOS_GPU
template class PairNvalchemiKokkos<LMPHostType>;
#endif
}    // namespace LAMMPS_NS
