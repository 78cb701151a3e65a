/* -*- c++ -*- ----------------------------------------------------------
   nvalchemi-lammps: the embedded-Python half of pair_style nvalchemi.
   The only header of the plugin that knows Python exists, and it does not
   include Python.h: the pair style sees plain C++ types and exceptions.
------------------------------------------------------------------------- */

#ifndef NVALCHEMI_PYTHON_BRIDGE_H
#define NVALCHEMI_PYTHON_BRIDGE_H

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace NvalchemiLammps {

// A Python exception, carrying its one-line text ("ValueError: ...") and, for errors
// that are not the user's to fix (any but ValueError, OSError, ImportError), the
// traceback: the pair style writes it to the log once instead of every rank's screen.
class PythonError : public std::runtime_error {
 public:
  explicit PythonError(const std::string &what, std::string traceback = "",
                       std::string type = "") :
      std::runtime_error(what), traceback_(std::move(traceback)), type_(std::move(type))
  {
  }
  const std::string &traceback() const { return traceback_; }
  // the exception's type name ("ValueError"), "" when not from a Python exception
  const std::string &type() const { return type_; }

 private:
  std::string traceback_;
  std::string type_;
};

// the pending Python exception as a PythonError (for the other bridge files); call with the GIL
[[noreturn]] void raise_pending_python_error(const std::string &context);

// Rows between ranks by an exchange plan (ExchangePlan, exchange_plan.h): forward,
// nsend() rows of `width` values go out (in the plan's send rows' order) and nrecv() come
// in; reverse, the other way round. float64 values, or float32 when `single`. Collective:
// every rank calls it, with the same width.
class PlanTransfer {
 public:
  virtual ~PlanTransfer() = default;
  virtual int nsend() const = 0;
  virtual int nrecv() const = 0;
  virtual void transfer(const void *send, void *recv, int width, bool single, bool reverse) = 0;
};

// LAMMPS's communication as the model sees it, on rows of doubles laid out as
// LAMMPS orders atoms (owned rows first, then ghosts), `width` values per row; transfer()
// by the exchange plan of the last topology (Step::owner).
class Collectives : public PlanTransfer {
 public:
  virtual int ntotal() const = 0;
  // ghost rows take their owner's row
  virtual void forward_exchange(double *rows, int width) = 0;
  // ghost rows are summed into their owners' rows, then zeroed
  virtual void reverse_exchange(double *rows, int width) = 0;
  // in-place sum over all ranks
  virtual void allreduce(double *values, int count) = 0;
};

// One model loaded into the embedded interpreter (nvalchemi_lammps.frontends.plugin).
class PythonSession {
 public:
  // device: "cpu", "cuda" (GPU local_rank modulo the node's GPUs) or "cuda:N"
  PythonSession(const std::string &model_path, int num_threads, const std::string &device,
                int local_rank);
  ~PythonSession();
  PythonSession(const PythonSession &) = delete;
  PythonSession &operator=(const PythonSession &) = delete;

  int layers() const { return layers_; }
  // the model also reads positions, charges and the cell (non-pairwise terms)
  bool needs_positions() const { return needs_positions_; }
  // the strategy the session decided (set_strategy): "local", "exchange" or "shell", the
  // pair cutoff and the ghost shell it needs (read back together from that one decision)
  const std::string &strategy() const { return strategy_; }
  bool uses_exchange() const { return strategy_ == "exchange"; }
  double cutoff() const { return cutoff_; }
  double ghost_cutoff() const { return ghost_cutoff_; }
  const std::string &units() const { return units_; }
  const std::string &description() const { return description_; }
  // "sha256:..." of the model's contents, and whether the file carried it (verified at
  // load) or it was computed here (a file written before digests)
  const std::string &digest() const { return digest_; }
  bool digest_verified() const { return digest_verified_; }

  // model element index per LAMMPS type name, -1 for NULL
  std::vector<int> map_types(const std::vector<std::string> &names);

  // choose how ghosts reach past one cutoff: "exchange" or "shell"
  void set_strategy(const std::string &strategy);
  // net charge, spin multiplicity (< 0: not given) and task ("": not given) of the whole
  // system, for models that take them
  void set_system_state(double charge, int spin, const std::string &task);
  // refuse a box the model cannot run in (periodic along x, y, z or not); raises PythonError
  void check_box(bool xperiodic, bool yperiodic, bool zperiodic);
  // run the model under torch.compile in this mode ("default", "reduce-overhead", ...) on
  // graphs padded to capacities with headroom, or not at all ("no"); returns what runs
  // compiled, for the log ("" for "no")
  std::string set_compile(const std::string &mode);
  // capture the model's forward and backward as CUDA graphs on graphs padded to capacities
  // ("yes"; on the CPU the same padded buffers without graphs), or not ("no"); "auto": on a
  // GPU unless compiling. Call after set_compile; returns the line for the log ("" when
  // there is nothing to say)
  std::string set_capture(const std::string &mode);
  // graphs compiled (torch.compile) or captured (CUDA graphs) so far (-1: neither) and the
  // capacities padded to
  struct CompileStatus {
    long graphs, atoms, pairs;
    double seconds;    // the captures' wall time (0 for torch.compile)
  };
  CompileStatus compile_status();
  // what the counts of captures do not say, for the log at the end of a run: why captured
  // terms run eagerly after all ("NAME runs eagerly: REASON"), how many collectives between
  // ranks run between the graphs of the others; "" when nothing
  std::string capture_notes();

  // the model takes each pair once (a half neighbor list): asked at each init_style,
  // after the strategy and compile mode are set
  bool half_pairs();

  // the model's tensors live on a GPU: the pair style then keeps pairs there between
  // neighbor-list builds and lets the model build rij and filter the cutoff itself
  bool on_device() const { return on_device_; }

  // One step on one rank. Atoms are rows as LAMMPS stores them (owned, then ghosts).
  struct Step {
    int nlocal, ntotal;
    const double *positions;    // 3*ntotal, every step
    // The topology, when new_topology (else the model keeps the last one):
    bool new_topology;
    const int64_t *species;    // ntotal
    // The exchange plan (strategy exchange, else owner is nullptr): the row of [owned rows,
    // nrecv rows received from other ranks] that each row (ntotal) copies, and the nsend
    // owned rows other ranks receive; `remote`: more than one rank, so transfers happen.
    const int64_t *owner;
    const int64_t *send_rows;
    int nsend, nrecv;
    bool remote;
    // Pairs (i, j), npairs of them, given with the topology: with `filtered`, those
    // within the cutoff, rij filled; else the neighbor list's candidates (skin
    // included), which the model keeps, filters and builds rij for each step.
    int npairs;
    bool filtered;
    // pair slots, `capacity` of them; results may come back in them (Result::npairs)
    int capacity;
    int64_t *pair_i, *pair_j;
    double *rij;    // 3 per slot
    // per-pair forces wanted back (per-atom virial) even when per-atom forces are cheaper
    bool want_pairs;
    // the pairs are a half neighbor list (half_pairs()): energies come back for every row
    bool half_pairs;
    // per-atom energies wanted (eflag_atom); else Result::atom_energies may stay unwritten
    bool want_atom_energies;
    // what a model with needs_positions() reads besides the pairs
    const double *charges;    // ntotal, or nullptr without per-atom charges
    double cell[9];           // lattice vectors as rows
    int periodic[3];
    // atom IDs of the ntotal rows (tagint, tag_bytes each) and the step, for reports
    const void *tags;
    int tag_bytes;
    int64_t timestep;
  };

  struct Result {
    double energy;             // sum of atom_energies; NaN when any energy or force is not finite
    double *atom_energies;     // ntotal slots; nlocal written, ntotal with Step::half_pairs
    double *pair_forces;       // 3 per pair slot: fij = +dE/drij
    // 1 per pair slot: s with fij = s * rij, for a pair potential's closed form; written
    // instead of pair_forces when pair_scalars_written
    double *pair_scalars;
    bool pair_scalars_written;
    int npairs;                // pairs written back (pair_i, pair_j, rij, pair_forces), or 0
    double *atom_forces;       // 3*ntotal: -dE/dx of owned and ghost rows, when written
    bool atom_forces_written;
    double *virial;            // 6, xx yy zz xy xz yz: the part that f.r misses (needs_positions)
    // with a NaN energy: the report naming the atoms and the step (frontends/_write_back.py)
    std::string nonfinite;
  };

  // run the potential on one rank's graph. The model may call the collectives during
  // the call, never after.
  void compute(const Step &step, Result &result, Collectives *collectives);

  // the Python session object (PyObject *), for the KOKKOS variant's step (kokkos_bridge.cpp)
  void *python_object() const { return session_; }

 private:
  void *session_;    // PyObject *, opaque here
  void *step_type_;  // PyObject *: the Python side's StepRecord
  double cutoff_;
  int layers_;
  bool needs_positions_;
  std::string strategy_;
  double ghost_cutoff_;
  bool on_device_;
  std::string units_;
  std::string description_;
  std::string digest_;
  bool digest_verified_;
};

}    // namespace NvalchemiLammps

#endif
