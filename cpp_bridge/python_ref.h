/* ----------------------------------------------------------------------
   nvalchemi-lammps: scope guards for the embedded Python of both pair
   styles (python_bridge.cpp, kokkos_bridge.cpp). Include after Python.h.
------------------------------------------------------------------------- */

#ifndef NVALCHEMI_PYTHON_REF_H
#define NVALCHEMI_PYTHON_REF_H

namespace NvalchemiLammps {

// The GIL, held for the scope.
class GilLock {
 public:
  GilLock() : state_(PyGILState_Ensure()) {}
  ~GilLock() { PyGILState_Release(state_); }
  GilLock(const GilLock &) = delete;
  GilLock &operator=(const GilLock &) = delete;

 private:
  PyGILState_STATE state_;
};

// Owned reference, released on scope exit.
class PyRef {
 public:
  explicit PyRef(PyObject *obj = nullptr) : obj_(obj) {}
  ~PyRef() { Py_XDECREF(obj_); }
  PyRef(const PyRef &) = delete;
  PyRef &operator=(const PyRef &) = delete;
  PyObject *get() const { return obj_; }
  void reset(PyObject *obj)
  {
    Py_XDECREF(obj_);
    obj_ = obj;
  }
  explicit operator bool() const { return obj_ != nullptr; }

 private:
  PyObject *obj_;
};

class PlanTransfer;

// The collectives' Python method transfer(send, recv, width, reverse) on `target`: float64
// or float32 buffers of the plan's sizes (python_bridge.cpp)
PyObject *call_transfer(PlanTransfer *target, PyObject *args);

}    // namespace NvalchemiLammps

#endif
