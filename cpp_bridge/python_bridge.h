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

// One model loaded into the embedded interpreter (nvalchemi_lammps.frontends.plugin).
class PythonSession {
 public:
  PythonSession(const std::string &model_path, int num_threads);
  ~PythonSession();
  PythonSession(const PythonSession &) = delete;
  PythonSession &operator=(const PythonSession &) = delete;

  double cutoff() const { return cutoff_; }
  const std::string &units() const { return units_; }
  const std::string &description() const { return description_; }

  // model element index per LAMMPS type name, -1 for NULL
  std::vector<int> map_types(const std::vector<std::string> &names);

  // run the potential on one rank's graph; writes atom_energies[nlocal] and
  // pair_forces[3*npairs]; returns the sum of atom_energies
  double compute(int nlocal, int ntotal, const int64_t *species, int npairs, const int64_t *pair_i,
                 const int64_t *pair_j, const double *rij, double *atom_energies,
                 double *pair_forces);

 private:
  void *session_;    // PyObject *, opaque here
  double cutoff_;
  std::string units_;
  std::string description_;
};

}    // namespace NvalchemiLammps

#endif
