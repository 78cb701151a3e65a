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

#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace NvalchemiLammps {
class ExchangePlan;
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
  void modify_params(int, char **) override;
  void init_style() override;
  double init_one(int, int) override;
  double memory_usage() override;
  void finish() override;

  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;
  int pack_reverse_comm(int, int, double *) override;
  void unpack_reverse_comm(int, int *, double *) override;

  // LAMMPS communication of per-atom rows for the model (see python_bridge.h)
  void forward_exchange(double *rows, int width);
  void reverse_exchange(double *rows, int width);
  // the exchange plan of the last neighbor-list build (strategy exchange; see
  // PythonSession::Step): rows between ranks
  NvalchemiLammps::ExchangePlan &plan() const { return *exchange_plan; }

 protected:
  NvalchemiLammps::PythonSession *session;
  int layers;       // message-passing steps of the model (1 = strictly local)
  int shell;        // 1: ghost shell of layers x cutoff with ghost pairs, no exchange
  bool half_pairs;  // a half neighbor list: the model takes each pair once (init_style)
  int *map;         // LAMMPS type -> model element index, -1 for NULL
  // what pads the model's graphs to capacities, for finish()'s report: torch.compile
  // (keyword compile), capture (keyword capture: CUDA graphs; on the CPU the padded buffers
  // alone), or neither
  enum class Padding { NONE, COMPILE, CAPTURE };
  Padding padding;
  long graphs_before;    // graphs compiled or captured on this rank before the current run
  double seconds_before; // seconds the captures took on this rank before the current run

  // the rows being exchanged: width values per atom, columns [offset, offset+count)
  double *exchange_rows;
  int exchange_width, exchange_offset, exchange_count;

  // per-step buffers handed to Python without copying
  int maxatom, maxpair;
  bigint *species;
  // exchange plan: the row of [owned rows, rows received from other ranks] each row
  // copies, and what goes to and comes from each rank
  bigint *owner;
  NvalchemiLammps::ExchangePlan *exchange_plan;
  // from the last neighbor-list build: every listed pair (cutoff plus skin)
  bigint *candidate_i, *candidate_j;
  int ncandidates;
  int topology_ntotal;    // rows at that build, -1 before the first
  bigint *pair_i, *pair_j;
  double *rij, *pair_forces, *atom_energies;
  double *pair_scalars;       // 1 per pair: fij = s * rij (a pair potential's closed form)
  double *atom_forces;        // 3 per owned and ghost atom, from non-pairwise terms
  double extra_virial[6];     // their virial beyond f.r

  std::string model_path;    // as given to pair_style, for the messages
  // what changes what is computed, compared across ranks (check_same_settings): the
  // pair_style keywords as (name, value) and the pair_coeff element names
  std::vector<std::pair<std::string, std::string>> keywords;
  std::string elements;
  std::string mix_rule;    // pair_modify mix as written, "" when not

  // the device the model runs on, from the keyword device ("" when not given)
  virtual std::string model_device(const std::string &given) const;
  void allocate();
  void check_same_settings();
  virtual std::vector<std::pair<std::string, std::string>> compared_settings() const;
  void apply_pair_forces(int npairs, bool scalars, const bigint *slot_i, const bigint *slot_j);
  void stop_where_failed(const std::string &failure, const std::string &elsewhere);
  void log_traceback(const std::exception &err);
  [[noreturn]] void abort_one(const std::string &file, int line, const std::string &message);
  static std::string with_type(const std::exception &err);
  void grow_buffers(int natoms, int npairs);
  void build_topology();
};

}    // namespace LAMMPS_NS

#endif
#endif
