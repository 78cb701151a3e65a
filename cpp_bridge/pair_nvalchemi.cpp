/* ----------------------------------------------------------------------
   nvalchemi-lammps: pair_style nvalchemi

   Each step the pair style gives the model this rank's atoms (owned rows
   first, then ghosts, as LAMMPS stores them) and every directed pair (i, j)
   with i owned and r_ij < cutoff, and takes back the owned atoms' energies
   and the pair forces fij = +dE/drij, or their sums per atom. Forces on ghost
   atoms are left for LAMMPS's reverse communication (newton pair on), so a
   multi-rank run equals a single-process one to rounding. A model with
   symmetric pair terms (Lennard-Jones) gets lj/cut's half list instead, each
   pair once, gives energies of ghost rows too (folded like their forces) and
   its forces as one scalar per pair, fij = s * rij, multiplied here.

   A model on a GPU gets the pairs only when LAMMPS rebuilds its neighbor list
   (all candidates, skin included) and positions every step: it builds rij and
   applies the cutoff on the device, and returns per-atom forces unless
   per-pair ones are needed (per-atom virial).

   Ghost features (strategy exchange) move by an exchange plan made at each
   list build: gathers on the model's device, and between ranks only one row
   per remote atom that ghosts here image.
------------------------------------------------------------------------- */

#include "pair_nvalchemi.h"

#include "atom.h"
#include "comm.h"
#include "domain.h"
#include "error.h"
#include "exceptions.h"
#include "force.h"
#include "memory.h"
#include "neigh_list.h"
#include "neighbor.h"
#include "update.h"

#include "exchange_plan.h"
#include "neighbor_pairs.h"
#include "python_bridge.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace LAMMPS_NS;
using NvalchemiLammps::Collectives;
using NvalchemiLammps::ExchangePlan;
using NvalchemiLammps::PythonSession;

// Values per atom in one forward/reverse communication; wider rows go in
// several rounds. LAMMPS sizes its buffers from comm_forward/comm_reverse at
// init, so this bounds what one round may send.
static constexpr int EXCHANGE_CHUNK = 64;

namespace {

// The pair style's communication, as the model's collectives.
class PairCollectives : public Collectives {
 public:
  PairCollectives(PairNvalchemi *pair, Atom *atom, MPI_Comm world) :
      pair(pair), atom(atom), world(world)
  {
  }
  int ntotal() const override { return atom->nlocal + atom->nghost; }
  void forward_exchange(double *rows, int width) override { pair->forward_exchange(rows, width); }
  void reverse_exchange(double *rows, int width) override { pair->reverse_exchange(rows, width); }
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
  PairNvalchemi *pair;
  Atom *atom;
  MPI_Comm world;
};

}    // namespace

/* ---------------------------------------------------------------------- */

PairNvalchemi::PairNvalchemi(LAMMPS *lmp) :
    Pair(lmp), session(nullptr), layers(1), shell(0), half_pairs(false), map(nullptr),
    padding(Padding::NONE), graphs_before(0), seconds_before(0.0),
    exchange_rows(nullptr), exchange_width(0), exchange_offset(0), exchange_count(0), maxatom(0),
    maxpair(0),
    species(nullptr), owner(nullptr), exchange_plan(new ExchangePlan(world)),
    candidate_i(nullptr), candidate_j(nullptr), ncandidates(0), topology_ntotal(-1),
    pair_i(nullptr), pair_j(nullptr), rij(nullptr), pair_forces(nullptr), atom_energies(nullptr),
    pair_scalars(nullptr), atom_forces(nullptr)
{
  single_enable = 0;
  restartinfo = 0;
  one_coeff = 1;
  manybody_flag = 1;
  centroidstressflag = CENTROID_NOTAVAIL;
  comm_forward = EXCHANGE_CHUNK;
  comm_reverse = EXCHANGE_CHUNK;
}

/* ---------------------------------------------------------------------- */

PairNvalchemi::~PairNvalchemi()
{
  if (copymode) return;
  delete session;
  delete exchange_plan;
  memory->destroy(species);
  memory->destroy(owner);
  memory->destroy(candidate_i);
  memory->destroy(candidate_j);
  memory->destroy(pair_i);
  memory->destroy(pair_j);
  memory->destroy(rij);
  memory->destroy(pair_forces);
  memory->destroy(pair_scalars);
  memory->destroy(atom_energies);
  memory->destroy(atom_forces);
  if (allocated) {
    memory->destroy(setflag);
    memory->destroy(cutsq);
    memory->destroy(cutghost);
    delete[] map;
  }
}

/* ---------------------------------------------------------------------- */

void PairNvalchemi::compute(int eflag, int vflag)
{
  ev_init(eflag, vflag);

  double **x = atom->x;
  double **f = atom->f;
  const int nlocal = atom->nlocal;
  const int ntotal = nlocal + atom->nghost;

  // Atom order, types and the neighbor list change only when LAMMPS rebuilds the list:
  // a model on a GPU keeps the topology (species, candidate pairs, exchange plan) there
  // in between and gets only positions each step.
  const bool filtered = !session->on_device();
  // neighbor->ago is 0 on every rank at once after a build (a run's setup too); the atom
  // count alone misses a rebuild that reorders atoms. Every rank must agree: the exchange
  // plan is collective.
  const bool rebuilt = neighbor->ago == 0 || topology_ntotal < 0;
  if (rebuilt) build_topology();
  // host: the pairs within the cutoff each step; GPU: the candidates, sent when rebuilt
  bigint *slot_i = filtered ? pair_i : candidate_i;
  bigint *slot_j = filtered ? pair_j : candidate_j;

  PythonSession::Step step{};
  step.nlocal = nlocal;
  step.ntotal = ntotal;
  step.positions = ntotal ? &x[0][0] : nullptr;
  step.new_topology = rebuilt || filtered;
  step.species = species;
  const bool exchanging = session->uses_exchange();
  step.owner = exchanging ? owner : nullptr;
  step.send_rows = exchanging ? exchange_plan->send_rows().data() : nullptr;
  step.nsend = exchanging ? exchange_plan->nsend() : 0;
  step.nrecv = exchanging ? exchange_plan->nrecv() : 0;
  step.remote = comm->nprocs > 1;
  step.filtered = filtered;
  step.npairs = filtered ? NvalchemiLammps::pairs_within(session->cutoff(), atom->x, candidate_i,
                                                         candidate_j, ncandidates, pair_i, pair_j,
                                                         rij)
                         : ncandidates;
  step.capacity = maxpair;
  step.pair_i = slot_i;
  step.pair_j = slot_j;
  step.rij = rij;
  step.want_pairs = vflag_either != 0;
  step.half_pairs = half_pairs;
  step.want_atom_energies = eflag_atom != 0;
  step.tags = atom->tag;
  step.tag_bytes = sizeof(tagint);
  step.timestep = update->ntimestep;
  if (session->needs_positions()) {
    step.charges = atom->q_flag ? atom->q : nullptr;
    const double *h = domain->h;    // xprd yprd zprd yz xz xy
    const double cell[9] = {h[0], 0.0, 0.0, h[5], h[1], 0.0, h[4], h[3], h[2]};
    std::copy(cell, cell + 9, step.cell);
    step.periodic[0] = domain->xperiodic;
    step.periodic[1] = domain->yperiodic;
    step.periodic[2] = domain->zperiodic;
  }

  PythonSession::Result result{};
  result.atom_energies = atom_energies;
  result.pair_forces = pair_forces;
  result.pair_scalars = pair_scalars;
  result.atom_forces = atom_forces;
  result.virial = extra_virial;
  PairCollectives collectives(this, atom, world);
  try {
    session->compute(step, result, &collectives);
  } catch (std::exception &err) {
    // rank-local failure: error->one aborts every rank instead of leaving the
    // others waiting in the next collective
    log_traceback(err);
    abort_one(FLERR, fmt::format("Pair style nvalchemi failed at step {}: {}", update->ntimestep,
                                 with_type(err)));
  }
  // a non-finite energy, force or position: the session's report names the atoms
  if (!result.nonfinite.empty()) abort_one(FLERR, "Pair style nvalchemi: " + result.nonfinite);
  apply_pair_forces(result.npairs, result.pair_scalars_written, slot_i, slot_j);

  // per-atom forces: the pairs' sum when that came back instead of the pairs, and the
  // non-pairwise terms; ghost rows are reverse-communicated by LAMMPS like pair forces
  if (result.atom_forces_written)
    for (int k = 0; k < ntotal; k++) {
      f[k][0] += atom_forces[3 * k + 0];
      f[k][1] += atom_forces[3 * k + 1];
      f[k][2] += atom_forces[3 * k + 2];
    }
  // the virial that f.r of the non-pairwise forces misses
  if (session->needs_positions() && (vflag_global || vflag_fdotr))
    for (int k = 0; k < 6; k++) virial[k] += extra_virial[k];

  if (eflag_global) eng_vdwl += result.energy;
  // on a half list ghost rows carry energy too; LAMMPS folds them into their owners
  // (newton pair on), as it does lj/cut's
  if (eflag_atom)
    for (int i = 0; i < (half_pairs ? ntotal : nlocal); i++) eatom[i] += atom_energies[i];

  if (vflag_fdotr) virial_fdotr_compute();
}

/* ----------------------------------------------------------------------
   after a neighbor-list build: species, candidate pairs and the exchange
   plan (ghost features: a ghost copies its owner's row; every row's origin,
   rank and owned row there, travels to the ghosts by LAMMPS's forward
   communication exactly as positions do, through intermediate ghosts)
------------------------------------------------------------------------- */

void PairNvalchemi::build_topology()
{
  const int *type = atom->type;
  const int nlocal = atom->nlocal;
  const int ntotal = nlocal + atom->nghost;

  // receivers: owned atoms; with the widened shell also ghosts, whose
  // features are then computed here instead of being exchanged
  const int nreceivers = shell ? list->inum + list->gnum : list->inum;
  grow_buffers(ntotal, NvalchemiLammps::listed_pair_count(list, nreceivers));
  for (int k = 0; k < ntotal; k++) species[k] = map[type[k]];
  ncandidates = NvalchemiLammps::listed_pairs(list, nreceivers, species, candidate_i, candidate_j);

  if (session->uses_exchange()) {
    std::vector<double> origin(2 * static_cast<size_t>(ntotal));
    for (int i = 0; i < nlocal; i++) {
      origin[2 * i] = comm->me;
      origin[2 * i + 1] = i;
    }
    forward_exchange(origin.data(), 2);
    exchange_plan->build(origin.data(), nlocal, ntotal, owner);
  }
  topology_ntotal = ntotal;
}

/* ----------------------------------------------------------------------
   f[i] += fij, f[j] -= fij for the pairs that came back, fij given as a
   vector or, for a pair potential's closed form, as s * rij (multiplied here:
   the same product torch would form, so the same bits)
------------------------------------------------------------------------- */

void PairNvalchemi::apply_pair_forces(int npairs, bool scalars, const bigint *slot_i,
                                      const bigint *slot_j)
{
  if (npairs == 0) return;
  // LAMMPS stores x and f as contiguous rows of three; local pointers let the compiler
  // keep them in registers instead of reloading members after every store
  double *const f0 = atom->f[0];
  const double *const d0 = rij;
  const double *const s0 = pair_scalars;
  const double *const fij0 = pair_forces;
  auto pair_force = [&](int k, double *fij) {
    const double *d = d0 + 3 * k;
    if (scalars) {
      fij[0] = s0[k] * d[0];
      fij[1] = s0[k] * d[1];
      fij[2] = s0[k] * d[2];
    } else {
      fij[0] = fij0[3 * k + 0];
      fij[1] = fij0[3 * k + 1];
      fij[2] = fij0[3 * k + 2];
    }
  };
  for (int k = 0; k < npairs; k++) {
    double fij[3];
    pair_force(k, fij);
    double *fi = f0 + 3 * slot_i[k];
    double *fj = f0 + 3 * slot_j[k];
    fi[0] += fij[0];
    fi[1] += fij[1];
    fi[2] += fij[2];
    fj[0] -= fij[0];
    fj[1] -= fij[1];
    fj[2] -= fij[2];
  }
  // virial (x_i - x_j) (x) f_i = -rij (x) fij; per atom, half onto i and half onto j.
  // With fdotr (the default) the global part waits for virial_fdotr_compute().
  if (!vflag_either) return;
  const int nlocal = atom->nlocal;
  for (int k = 0; k < npairs; k++) {
    double fij[3];
    pair_force(k, fij);
    const double *d = d0 + 3 * k;
    ev_tally_xyz(static_cast<int>(slot_i[k]), static_cast<int>(slot_j[k]), nlocal, 1, 0.0, 0.0,
                 fij[0], fij[1], fij[2], -d[0], -d[1], -d[2]);
  }
}

/* ----------------------------------------------------------------------
   allocate all arrays
------------------------------------------------------------------------- */

void PairNvalchemi::allocate()
{
  allocated = 1;
  const int np1 = atom->ntypes + 1;
  memory->create(setflag, np1, np1, "pair:setflag");
  memory->create(cutsq, np1, np1, "pair:cutsq");
  memory->create(cutghost, np1, np1, "pair:cutghost");
  map = new int[np1];
  for (int i = 0; i < np1; i++) {
    map[i] = -1;
    for (int j = 0; j < np1; j++) setflag[i][j] = 0;
  }
}

/* ---------------------------------------------------------------------- */

void PairNvalchemi::grow_buffers(int natoms, int npairs)
{
  if (natoms > maxatom) {
    maxatom = natoms;
    memory->destroy(species);
    memory->destroy(owner);
    memory->destroy(atom_energies);
    memory->destroy(atom_forces);
    memory->create(species, maxatom, "pair:species");
    memory->create(owner, maxatom, "pair:owner");
    memory->create(atom_energies, maxatom, "pair:atom_energies");
    memory->create(atom_forces, 3 * maxatom, "pair:atom_forces");
  }
  if (npairs > maxpair) {
    maxpair = npairs;
    memory->destroy(candidate_i);
    memory->destroy(candidate_j);
    memory->destroy(pair_i);
    memory->destroy(pair_j);
    memory->destroy(rij);
    memory->destroy(pair_forces);
    memory->destroy(pair_scalars);
    memory->create(candidate_i, maxpair, "pair:candidate_i");
    memory->create(candidate_j, maxpair, "pair:candidate_j");
    memory->create(pair_i, maxpair, "pair:pair_i");
    memory->create(pair_j, maxpair, "pair:pair_j");
    memory->create(rij, 3 * maxpair, "pair:rij");
    memory->create(pair_forces, 3 * maxpair, "pair:pair_forces");
    memory->create(pair_scalars, maxpair, "pair:pair_scalars");
  }
}

/* ----------------------------------------------------------------------
   global settings: pair_style nvalchemi <model file> [device D] [strategy S] [charge Q]
   [spin S] [task NAME] [compile no|yes|MODE] [capture yes|no|auto]
------------------------------------------------------------------------- */

void PairNvalchemi::settings(int narg, char **arg)
{
  if (narg < 1) utils::missing_cmd_args(FLERR, "pair_style nvalchemi", error);
  std::string strategy = "auto";
  std::string device;    // not given: model_device() decides
  double total_charge = 0.0;
  int spin = -1;    // not given: the model's default
  std::string task; // likewise
  std::string compile_mode = "no", compiled; // compiled: what runs compiled, for the log
  std::string capture_mode = "auto", captured; // captured: what runs captured, likewise
  int iarg = 1;
  while (iarg < narg) {
    if (strcmp(arg[iarg], "device") == 0) {
      if (iarg + 2 > narg) utils::missing_cmd_args(FLERR, "pair_style nvalchemi device", error);
      device = arg[iarg + 1];
      iarg += 2;
    } else if (strcmp(arg[iarg], "strategy") == 0) {
      if (iarg + 2 > narg) utils::missing_cmd_args(FLERR, "pair_style nvalchemi strategy", error);
      strategy = arg[iarg + 1];
      if (strategy != "exchange" && strategy != "shell" && strategy != "auto")
        error->all(FLERR, "pair_style nvalchemi strategy must be exchange, shell or auto; got {}",
                   strategy);
      iarg += 2;
    } else if (strcmp(arg[iarg], "charge") == 0) {
      if (iarg + 2 > narg) utils::missing_cmd_args(FLERR, "pair_style nvalchemi charge", error);
      total_charge = utils::numeric(FLERR, arg[iarg + 1], false, lmp);
      iarg += 2;
    } else if (strcmp(arg[iarg], "spin") == 0) {
      if (iarg + 2 > narg) utils::missing_cmd_args(FLERR, "pair_style nvalchemi spin", error);
      spin = utils::inumeric(FLERR, arg[iarg + 1], false, lmp);
      if (spin < 0) error->all(FLERR, "pair_style nvalchemi spin must be >= 0; got {}", spin);
      iarg += 2;
    } else if (strcmp(arg[iarg], "compile") == 0) {
      if (iarg + 2 > narg) utils::missing_cmd_args(FLERR, "pair_style nvalchemi compile", error);
      compile_mode = arg[iarg + 1];
      if (compile_mode == "yes") compile_mode = "default";
      iarg += 2;
    } else if (strcmp(arg[iarg], "capture") == 0) {
      if (iarg + 2 > narg) utils::missing_cmd_args(FLERR, "pair_style nvalchemi capture", error);
      capture_mode = arg[iarg + 1];
      if (capture_mode != "yes" && capture_mode != "no" && capture_mode != "auto")
        error->all(FLERR, "pair_style nvalchemi capture must be yes, no or auto; got {}",
                   capture_mode);
      iarg += 2;
    } else if (strcmp(arg[iarg], "task") == 0) {
      if (iarg + 2 > narg) utils::missing_cmd_args(FLERR, "pair_style nvalchemi task", error);
      task = arg[iarg + 1];
      iarg += 2;
    } else
      error->all(FLERR, "Unknown pair_style nvalchemi keyword: {}", arg[iarg]);
  }

  // settings() may run more than once: drop the previous model
  delete session;
  session = nullptr;
  topology_ntotal = -1;

  // rank within the node, for one GPU per rank under any launcher
  MPI_Comm node;
  int local_rank = 0;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, comm->me, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);

  model_path = arg[0];
  std::string message;
  try {
    session = new PythonSession(model_path, comm->nthreads, model_device(device), local_rank);
  } catch (std::exception &err) {
    message = err.what();
    log_traceback(err);
  }

  stop_where_failed(message.empty() ? message
                                    : fmt::format("Pair style nvalchemi cannot load model {}: {}",
                                                  model_path, message),
                    fmt::format("Pair style nvalchemi: model {} failed to load on", model_path));
  // what changes what is computed, compared across ranks before the model is configured
  const std::string device_used = model_device(device);    // cuda:N differs between ranks
  keywords = {{"strategy", strategy},
              {"device", device_used.substr(0, device_used.find(':'))},
              {"charge", fmt::format("{}", total_charge)},
              {"spin", spin < 0 ? std::string("not given") : std::to_string(spin)},
              {"task", task.empty() ? std::string("not given") : task},
              {"compile", compile_mode},
              {"capture", capture_mode}};
  check_same_settings();
  if (comm->me == 0 && !session->digest_verified())
    error->warning(FLERR, "Pair style nvalchemi: model file {} carries no digest (written before "
                   "nvalchemi-lammps checked them): its contents cannot be verified; export it "
                   "again to add one", model_path);

  // the model may refuse a strategy, a compile mode or capture: deterministic, so the same
  // on every rank
  padding = Padding::NONE;
  try {
    session->set_strategy(strategy);
    session->set_system_state(total_charge, spin, task);
    compiled = session->set_compile(compile_mode);
    captured = session->set_capture(capture_mode);
    if (compile_mode != "no")
      padding = Padding::COMPILE;
    else if (session->compile_status().graphs >= 0)
      padding = Padding::CAPTURE;
  } catch (std::exception &err) {
    log_traceback(err);
    error->all(FLERR, "pair_style nvalchemi: {}", err.what());
  }
  graphs_before = 0;
  seconds_before = 0.0;
  layers = session->layers();
  shell = session->strategy() == "shell" ? 1 : 0;
  ghostneigh = shell;
  if (comm->me == 0) {
    utils::logmesg(lmp, "pair_style nvalchemi: {} from {}\n", session->description(), model_path);
    if (layers > 1)
      utils::logmesg(lmp, "pair_style nvalchemi: {} message-passing layers, {}\n", layers,
                     shell ? fmt::format("ghost shell of {} x cutoff, no exchange", layers)
                           : std::string("ghost features exchanged after each layer"));
    if (!compiled.empty()) utils::logmesg(lmp, "pair_style nvalchemi: {}\n", compiled);
    if (!captured.empty()) utils::logmesg(lmp, "pair_style nvalchemi: {}\n", captured);
  }
}

/* ----------------------------------------------------------------------
   the model's device: as given, the CPU by default
------------------------------------------------------------------------- */

std::string PairNvalchemi::model_device(const std::string &given) const
{
  return given.empty() ? "cpu" : given;
}

/* ----------------------------------------------------------------------
   every rank computes the same thing: the model's digest (node-local copies
   of a model file may differ) and every setting that changes what is
   computed, gathered from all ranks at once; all stop together, naming the
   setting and the ranks where it differs from rank 0. Runs before anything
   that depends on them (the model's configuration, the neighbor request, the
   exchanges), which would stop one rank alone or hang on a mismatch.
------------------------------------------------------------------------- */

void PairNvalchemi::check_same_settings()
{
  static constexpr int SHOWN = 8;    // ranks named in the message
  // "name\nvalue\n" per setting: LAMMPS's arguments hold no newline
  std::string mine;
  for (const auto &setting : compared_settings())
    mine += setting.first + '\n' + setting.second + '\n';
  const int nprocs = comm->nprocs;
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(nprocs), first(nprocs + 1, 0);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, world);
  for (int r = 0; r < nprocs; r++) first[r + 1] = first[r] + lengths[r];
  std::vector<char> all(std::max(first[nprocs], 1));
  MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), first.data(), MPI_CHAR,
                 world);

  // each rank's lines: names and values alternating, in the same order on every rank
  std::vector<std::vector<std::string>> lines(nprocs);
  for (int r = 0; r < nprocs; r++) {
    const char *text = all.data() + first[r];
    for (int start = 0, k = 0; k < lengths[r]; k++)
      if (text[k] == '\n') {
        lines[r].emplace_back(text + start, k - start);
        start = k + 1;
      }
  }
  const std::vector<std::string> &reference = lines[0];
  for (size_t k = 0; k + 1 < reference.size(); k += 2) {
    std::vector<int> differ;
    for (int r = 1; r < nprocs; r++)
      if (lines[r].size() != reference.size() || lines[r][k + 1] != reference[k + 1])
        differ.push_back(r);
    if (differ.empty()) continue;
    const std::string &name = reference[k];
    if (name == "model") {
      std::string ranks;
      for (size_t n = 0; n < differ.size(); n++)
        ranks += fmt::format("{}{}", n ? ", " : "", differ[n]);
      error->all(FLERR, "Pair style nvalchemi: the model differs between ranks: rank(s) {} loaded "
                 "other contents than rank 0 ({}, {:.23}...); give every rank the same model "
                 "file", ranks, model_path, reference[k + 1]);
    }
    std::string values = fmt::format("rank 0 '{}'", reference[k + 1]);
    for (size_t n = 0; n < differ.size() && n < SHOWN; n++) {
      const std::vector<std::string> &other = lines[differ[n]];
      values += fmt::format(", rank {} '{}'", differ[n],
                            other.size() == reference.size() ? other[k + 1] : std::string("?"));
    }
    if (differ.size() > SHOWN) values += fmt::format(" ... ({} ranks differ)", differ.size());
    error->all(FLERR, "Pair style nvalchemi: the {} differs between ranks: {}; give every rank "
               "the same pair_style and pair_coeff", name, values);
  }
}

/* ----------------------------------------------------------------------
   what check_same_settings() compares, as (name, value): the model, the
   pair_style keywords that change what is computed, the element map
------------------------------------------------------------------------- */

std::vector<std::pair<std::string, std::string>> PairNvalchemi::compared_settings() const
{
  std::vector<std::pair<std::string, std::string>> settings = {{"model", session->digest()}};
  settings.insert(settings.end(), keywords.begin(), keywords.end());
  settings.emplace_back("element map", elements);
  return settings;
}

/* ----------------------------------------------------------------------
   set coeffs: pair_coeff * * <element or NULL per atom type>
------------------------------------------------------------------------- */

void PairNvalchemi::coeff(int narg, char **arg)
{
  if (!session) error->all(FLERR, "Pair style nvalchemi: pair_style must name a model file");
  if (!allocated) allocate();

  const int ntypes = atom->ntypes;
  if (narg < 2 || strcmp(arg[0], "*") != 0 || strcmp(arg[1], "*") != 0)
    error->all(FLERR, "Pair style nvalchemi needs pair_coeff * * followed by one element "
               "name per atom type");
  if (narg != 2 + ntypes)
    error->all(FLERR, "pair_coeff * * for pair style nvalchemi needs {} element names (one per "
               "atom type, NULL to skip a type), got {}", ntypes, narg - 2);

  std::vector<std::string> names(arg + 2, arg + narg);
  std::vector<int> mapped;
  std::string failure;
  try {
    mapped = session->map_types(names);
  } catch (std::exception &err) {
    log_traceback(err);
    failure = fmt::format("pair_coeff for pair style nvalchemi: {}", err.what());
  }
  // the names may differ between ranks (per-rank variables)
  stop_where_failed(failure, "pair_coeff for pair style nvalchemi failed on");

  for (int i = 1; i <= ntypes; i++) map[i] = mapped[i - 1];
  elements.clear();
  for (const auto &name : names) elements += (elements.empty() ? "" : " ") + name;
  // NULL leaves a type's pairs to another style: only hybrid has one (LAMMPS would
  // only say "All pair coeffs are not set")
  if (force->pair == this)
    for (int i = 1; i <= ntypes; i++)
      if (map[i] < 0)
        error->all(FLERR, "pair_coeff * * for pair style nvalchemi maps atom type {} to NULL, "
                   "which leaves its pairs without a potential: NULL is for pair_style hybrid "
                   "or hybrid/overlay, where another pair style covers type {}", i, i);
  int count = 0;
  for (int i = 1; i <= ntypes; i++)
    for (int j = i; j <= ntypes; j++) {
      setflag[i][j] = (map[i] >= 0 && map[j] >= 0) ? 1 : 0;
      count += setflag[i][j];
    }
  if (count == 0) error->all(FLERR, "pair_coeff for pair style nvalchemi maps no atom type");
}

/* ----------------------------------------------------------------------
   pair_modify as for any pair style, and whether mix was written: mix_flag
   cannot tell an explicit "mix geometric" from LAMMPS's default
------------------------------------------------------------------------- */

void PairNvalchemi::modify_params(int narg, char **arg)
{
  Pair::modify_params(narg, arg);
  // every keyword takes one value but nofdotr (Pair::modify_params checked them)
  for (int iarg = 0; iarg < narg; iarg += strcmp(arg[iarg], "nofdotr") == 0 ? 1 : 2)
    if (strcmp(arg[iarg], "mix") == 0) mix_rule = arg[iarg + 1];
}

/* ----------------------------------------------------------------------
   init specific to this pair style
------------------------------------------------------------------------- */

void PairNvalchemi::init_style()
{
  if (!session) error->all(FLERR, "Pair style nvalchemi: pair_style must name a model file");
  check_same_settings();
  // LAMMPS would accept these and change nothing: the energy is the model's alone
  auto refuse = [this](const std::string &what) {
    error->all(FLERR, "Pair style nvalchemi does not support pair_modify {}: the model gives the "
               "whole energy, so a tail correction, a shift at the cutoff or a mixing rule must "
               "be part of the model (see the pair_style nvalchemi docs); under pair_style "
               "hybrid, give it to the other style: pair_modify pair <style> {}", what, what);
  };
  if (tail_flag) refuse("tail yes");
  if (offset_flag) refuse("shift yes");
  if (!mix_rule.empty()) refuse("mix " + mix_rule);
  if (force->newton_pair == 0) error->all(FLERR, "Pair style nvalchemi requires newton pair on");
  if (atom->tag_enable == 0) error->all(FLERR, "Pair style nvalchemi requires atom IDs");
  if (session->units() != update->unit_style)
    error->all(FLERR, "Pair style nvalchemi: the model is in units {} but the input uses units "
               "{}; add 'units {}' before the box is created", session->units(),
               update->unit_style, session->units());

  // full list: every owned atom sees all its neighbors, ghosts included; with
  // the widened shell, ghosts get lists too. A model with symmetric pair terms takes
  // lj/cut's half list (each pair once, newton pair on): half the pairs to compute. A
  // KOKKOS variant (kokkosable) builds its graphs from full lists with its own door.
  try {
    half_pairs = !shell && !kokkosable && session->half_pairs();
    // a box the model cannot run in stops every rank here, not each at its first step
    session->check_box(domain->xperiodic, domain->yperiodic, domain->zperiodic);
  } catch (std::exception &err) {
    log_traceback(err);
    error->all(FLERR, "pair_style nvalchemi: {}", err.what());
  }
  if (shell)
    neighbor->add_request(this, NeighConst::REQ_FULL | NeighConst::REQ_GHOST);
  else
    neighbor->add_request(this, half_pairs ? NeighConst::REQ_DEFAULT : NeighConst::REQ_FULL);
}

/* ----------------------------------------------------------------------
   init for one type pair i,j and corresponding j,i
------------------------------------------------------------------------- */

double PairNvalchemi::init_one(int i, int j)
{
  // both cutoffs are the session's strategy decision (contract.resolve_strategy)
  if (!shell) return session->cutoff();
  // ghosts reach layers x cutoff deep; only pairs within the cutoff are used
  cutghost[i][j] = cutghost[j][i] = session->cutoff();
  return session->ghost_cutoff();
}

/* ----------------------------------------------------------------------
   end of a run: how many graphs torch.compile compiled, or how many times the
   model was captured, during it (the most on any rank; after the first run of
   an MD simulation this should stay 0) and how long the captures took on the
   slowest rank (what step 0 waited for), and rank 0's notes: which captured terms
   run eagerly after all, how many collectives between ranks run between graphs
------------------------------------------------------------------------- */

void PairNvalchemi::finish()
{
  if (padding == Padding::NONE || !session) return;
  NvalchemiLammps::PythonSession::CompileStatus status{-1, 0, 0, 0.0};
  std::string notes;
  try {
    status = session->compile_status();
    if (padding == Padding::CAPTURE) notes = session->capture_notes();
  } catch (std::exception &err) {
    log_traceback(err);
    abort_one(FLERR, fmt::format("pair_style nvalchemi: {}", err.what()));
  }
  long local[2] = {status.graphs - graphs_before, status.graphs}, most[2];
  MPI_Allreduce(local, most, 2, MPI_LONG, MPI_MAX, world);
  // the slowest rank's captures: what the run waited for
  double seconds = status.seconds - seconds_before, longest = 0.0;
  MPI_Allreduce(&seconds, &longest, 1, MPI_DOUBLE, MPI_MAX, world);
  graphs_before = status.graphs;
  seconds_before = status.seconds;
  if (comm->me != 0) return;
  if (padding == Padding::COMPILE)
    utils::logmesg(lmp,
                   "pair_style nvalchemi: torch.compile: {} graph(s) compiled during this run, "
                   "{} in all; padded to {} atoms and {} pairs on rank 0\n",
                   most[0], most[1], status.atoms, status.pairs);
  else if (most[1] > 0 || notes.empty())    // not when nothing was ever captured
    utils::logmesg(lmp,
                   "pair_style nvalchemi: {}: {} captured during this run{}, {} in all; padded "
                   "to {} atoms and {} pairs on rank 0\n",
                   session->on_device() ? "CUDA graphs" : "capture on the CPU (no graphs)",
                   most[0], most[0] ? fmt::format(" in {:.2f} s", longest) : "", most[1],
                   status.atoms, status.pairs);
  if (!notes.empty()) utils::logmesg(lmp, "pair_style nvalchemi: {}\n", notes);
}

/* ----------------------------------------------------------------------
   forward exchange of per-atom rows: ghost rows take their owner's row
------------------------------------------------------------------------- */

void PairNvalchemi::forward_exchange(double *rows, int width)
{
  exchange_rows = rows;
  exchange_width = width;
  for (exchange_offset = 0; exchange_offset < width; exchange_offset += EXCHANGE_CHUNK) {
    exchange_count = std::min(EXCHANGE_CHUNK, width - exchange_offset);
    comm->forward_comm(this, exchange_count);
  }
  exchange_rows = nullptr;
}

/* ----------------------------------------------------------------------
   reverse exchange of per-atom rows: ghost rows are added to their owner's
   row (through intermediate ghosts, as LAMMPS folds forces), then zeroed
------------------------------------------------------------------------- */

void PairNvalchemi::reverse_exchange(double *rows, int width)
{
  exchange_rows = rows;
  exchange_width = width;
  for (exchange_offset = 0; exchange_offset < width; exchange_offset += EXCHANGE_CHUNK) {
    exchange_count = std::min(EXCHANGE_CHUNK, width - exchange_offset);
    comm->reverse_comm(this, exchange_count);
  }
  const bigint nlocal = atom->nlocal;
  const bigint ntotal = nlocal + atom->nghost;
  for (bigint k = nlocal * width; k < ntotal * width; k++) rows[k] = 0.0;
  exchange_rows = nullptr;
}

/* ---------------------------------------------------------------------- */

int PairNvalchemi::pack_forward_comm(int n, int *list, double *buf, int /*pbc_flag*/,
                                     int * /*pbc*/)
{
  int m = 0;
  for (int ii = 0; ii < n; ii++) {
    const double *row = exchange_rows + static_cast<bigint>(list[ii]) * exchange_width;
    for (int k = 0; k < exchange_count; k++) buf[m++] = row[exchange_offset + k];
  }
  return m;
}

/* ---------------------------------------------------------------------- */

void PairNvalchemi::unpack_forward_comm(int n, int first, double *buf)
{
  int m = 0;
  for (int i = first; i < first + n; i++) {
    double *row = exchange_rows + static_cast<bigint>(i) * exchange_width;
    for (int k = 0; k < exchange_count; k++) row[exchange_offset + k] = buf[m++];
  }
}

/* ---------------------------------------------------------------------- */

int PairNvalchemi::pack_reverse_comm(int n, int first, double *buf)
{
  int m = 0;
  for (int i = first; i < first + n; i++) {
    const double *row = exchange_rows + static_cast<bigint>(i) * exchange_width;
    for (int k = 0; k < exchange_count; k++) buf[m++] = row[exchange_offset + k];
  }
  return m;
}

/* ---------------------------------------------------------------------- */

void PairNvalchemi::unpack_reverse_comm(int n, int *list, double *buf)
{
  int m = 0;
  for (int ii = 0; ii < n; ii++) {
    double *row = exchange_rows + static_cast<bigint>(list[ii]) * exchange_width;
    for (int k = 0; k < exchange_count; k++) row[exchange_offset + k] += buf[m++];
  }
}

/* ---------------------------------------------------------------------- */

double PairNvalchemi::memory_usage()
{
  double bytes = Pair::memory_usage();
  bytes += static_cast<double>(maxatom) * (2 * sizeof(bigint) + 4 * sizeof(double));
  bytes += static_cast<double>(maxpair) * (4 * sizeof(bigint) + 7 * sizeof(double));
  return bytes;
}
/* ----------------------------------------------------------------------
   a failure of some ranks only still stops every rank (failure: this rank's
   message, "" for none): one message when all failed, else each failing
   rank aborts with its own while the others name how many failed
------------------------------------------------------------------------- */

void PairNvalchemi::stop_where_failed(const std::string &failure, const std::string &elsewhere)
{
  int failed = failure.empty() ? 0 : 1;
  int nfailed = 0;
  MPI_Allreduce(&failed, &nfailed, 1, MPI_INT, MPI_SUM, world);
  if (nfailed == comm->nprocs) error->all(FLERR, failure);
  if (failed) abort_one(FLERR, failure);
  if (nfailed) error->all(FLERR, "{} {} rank(s)", elsewhere, nfailed);
}

/* ----------------------------------------------------------------------
   an error's text led by its Python exception type, once
------------------------------------------------------------------------- */

std::string PairNvalchemi::with_type(const std::exception &err)
{
  const auto *python = dynamic_cast<const NvalchemiLammps::PythonError *>(&err);
  const std::string text = err.what();
  if (!python || python->type().empty() || text.rfind(python->type(), 0) == 0) return text;
  return python->type() + ": " + text;
}

/* ----------------------------------------------------------------------
   a Python traceback goes to the log of rank 0 (its screen without a log),
   once; every failing rank's error message carries the exception's text
------------------------------------------------------------------------- */

void PairNvalchemi::log_traceback(const std::exception &err)
{
  const auto *python = dynamic_cast<const NvalchemiLammps::PythonError *>(&err);
  if (!python || python->traceback().empty() || comm->me != 0) return;
  FILE *out = logfile ? logfile : screen;
  if (!out) return;
  utils::print(out, "pair_style nvalchemi: Python traceback:\n{}", python->traceback());
  fflush(out);
}

/* ----------------------------------------------------------------------
   error->one (a failure of this rank alone ends the run), then a moment
   before LAMMPS's main calls MPI_Abort: mpirun may end the job before it has
   passed on what this rank printed (seen with MPICH's launcher on a loaded
   machine, two ranks failing at once: exit 1 and no message at all)
------------------------------------------------------------------------- */

void PairNvalchemi::abort_one(const std::string &file, int line, const std::string &message)
{
  try {
    error->one(file, line, message);
  } catch (LAMMPSAbortException &) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    throw;
  }
}
