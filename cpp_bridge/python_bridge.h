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
#include <vector>

namespace NvalchemiLammps {

// A Python exception, carrying its one-line text ("ValueError: ...").
class PythonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// LAMMPS's communication as the model sees it, on rows of doubles laid out as
// LAMMPS orders atoms (owned rows first, then ghosts), `width` values per row.
class Collectives {
 public:
  virtual ~Collectives() = default;
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

  double cutoff() const { return cutoff_; }
  int layers() const { return layers_; }
  // the model also reads positions, charges and the cell (non-pairwise terms)
  bool needs_positions() const { return needs_positions_; }
  bool uses_exchange() const { return uses_exchange_; }
  const std::string &units() const { return units_; }
  const std::string &description() const { return description_; }

  // model element index per LAMMPS type name, -1 for NULL
  std::vector<int> map_types(const std::vector<std::string> &names);

  // choose how ghosts reach past one cutoff: "exchange" or "shell"
  void set_strategy(const std::string &strategy);
  // net charge of the whole system, for models that predict charges
  void set_total_charge(double charge);

  // What a model with needs_positions() reads besides the pairs, and the two
  // extra results it gives: forces on owned and ghost atoms, and the part of
  // the virial that is not f.r of those forces (6 values, xx yy zz xy xz yz).
  struct System {
    const double *positions;    // 3*ntotal
    const double *charges;      // ntotal, or nullptr without per-atom charges
    double cell[9];             // lattice vectors as rows
    int periodic[3];
    double *atom_forces;    // 3*ntotal, written
    double *virial;         // 6, written
  };

  // run the potential on one rank's graph; writes atom_energies[nlocal] and
  // pair_forces[3*npairs] (and what `system` asks for, when given); returns the
  // sum of atom_energies. The model may call the collectives during the call,
  // never after.
  double compute(int nlocal, int ntotal, const int64_t *species, int npairs, const int64_t *pair_i,
                 const int64_t *pair_j, const double *rij, double *atom_energies,
                 double *pair_forces, Collectives *collectives, System *system);

 private:
  void *session_;    // PyObject *, opaque here
  double cutoff_;
  int layers_;
  bool needs_positions_;
  bool uses_exchange_;
  std::string units_;
  std::string description_;
};

}    // namespace NvalchemiLammps

#endif
