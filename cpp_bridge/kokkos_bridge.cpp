/* ----------------------------------------------------------------------
   nvalchemi-lammps: embedded Python for pair_style nvalchemi/kk.

   Each step hands nvalchemi_lammps.frontends.kokkos.compute() DLPack
   capsules over LAMMPS's device arrays (torch.from_dlpack wraps them without
   a copy) and an object whose methods run KOKKOS's pair communication on
   device arrays the model passes by address.
------------------------------------------------------------------------- */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kokkos_bridge.h"
#include "python_bridge.h"
#include "python_ref.h"

#include <string>

using namespace NvalchemiLammps;

namespace {

constexpr const char *KOKKOS_FRONTEND_MODULE = "nvalchemi_lammps.frontends.kokkos";

/* ----------------------------------------------------------------------
   DLPack (dlpack.h v0.8 ABI, what torch.from_dlpack reads from a "dltensor"
   capsule); declared here, field for field, so no dlpack.h is needed
------------------------------------------------------------------------- */

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(DLManagedTensor *self);
};

// a managed tensor with its own shape and strides; the data stays LAMMPS's
struct Exported {
  DLManagedTensor managed;
  int64_t shape[2];
  int64_t strides[2];
};

void delete_exported(DLManagedTensor *self)
{
  delete static_cast<Exported *>(self->manager_ctx);
}

void capsule_destructor(PyObject *capsule)
{
  // a capsule torch consumed is renamed "used_dltensor" and torch calls the deleter
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto *managed = static_cast<DLManagedTensor *>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed && managed->deleter) managed->deleter(managed);
}

PyObject *capsule(const DeviceArray &array)
{
  if (!array.data && array.ndim == 0) Py_RETURN_NONE;
  auto *out = new Exported{};
  for (int d = 0; d < array.ndim; d++) {
    out->shape[d] = array.shape[d];
    out->strides[d] = array.strides[d];
  }
  static char empty = 0;    // an empty view may have no data; DLPack wants a pointer
  DLTensor &t = out->managed.dl_tensor;
  t.data = array.data ? array.data : &empty;
  t.device = {array.device_type, array.device_id};
  t.ndim = array.ndim;
  t.dtype = {static_cast<uint8_t>(array.code), static_cast<uint8_t>(array.bits), 1};
  t.shape = out->shape;
  t.strides = out->strides;
  t.byte_offset = 0;
  out->managed.manager_ctx = out;
  out->managed.deleter = delete_exported;
  PyObject *result = PyCapsule_New(&out->managed, "dltensor", capsule_destructor);
  if (!result) delete out;
  return result;
}

/* ----------------------------------------------------------------------
   KokkosCollectives: the Python face of a DeviceCollectives object, valid
   only during one compute_on_device() call
------------------------------------------------------------------------- */

struct CollectivesObject {
  PyObject_HEAD DeviceCollectives *target;
};

DeviceCollectives *live_target(PyObject *self)
{
  DeviceCollectives *target = reinterpret_cast<CollectivesObject *>(self)->target;
  if (!target)
    PyErr_SetString(PyExc_RuntimeError,
                    "LAMMPS collectives used after the pair compute call returned");
  return target;
}

// exchange(address, nrows, width): in place on nrows x width float64 values at address
template <bool FORWARD> PyObject *exchange(PyObject *self, PyObject *args)
{
  unsigned long long address;
  int nrows, width;
  if (!PyArg_ParseTuple(args, "Kii", &address, &nrows, &width)) return nullptr;
  DeviceCollectives *target = live_target(self);
  if (!target) return nullptr;
  if (nrows != target->ntotal())
    return PyErr_Format(PyExc_ValueError, "LAMMPS exchange got %d rows, wanted %d", nrows,
                        target->ntotal());
  if (width < 1) return PyErr_Format(PyExc_ValueError, "exchange width must be >= 1, got %d", width);
  Py_BEGIN_ALLOW_THREADS;
  target->exchange(reinterpret_cast<double *>(static_cast<uintptr_t>(address)), nrows, width,
                   FORWARD);
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}

PyObject *allreduce(PyObject *self, PyObject *args)
{
  PyObject *obj;
  if (!PyArg_ParseTuple(args, "O", &obj)) return nullptr;
  DeviceCollectives *target = live_target(self);
  if (!target) return nullptr;
  Py_buffer view;
  if (PyObject_GetBuffer(obj, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
    return nullptr;
  if (view.itemsize != sizeof(double) || !view.format || std::string(view.format) != "d") {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_TypeError, "LAMMPS allreduce needs a float64 buffer");
    return nullptr;
  }
  const int count = static_cast<int>(view.len / static_cast<Py_ssize_t>(sizeof(double)));
  Py_BEGIN_ALLOW_THREADS;
  target->allreduce(static_cast<double *>(view.buf), count);
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&view);
  Py_RETURN_NONE;
}

PyObject *transfer(PyObject *self, PyObject *args)
{
  DeviceCollectives *target = live_target(self);
  return target ? call_transfer(target, args) : nullptr;
}

PyObject *ntotal(PyObject *self, PyObject *)
{
  DeviceCollectives *target = live_target(self);
  if (!target) return nullptr;
  return PyLong_FromLong(target->ntotal());
}

PyMethodDef collectives_methods[] = {
    {"forward_exchange", exchange<true>, METH_VARARGS,
     "forward_exchange(address, nrows, width): ghost rows of a contiguous float64 (nrows, "
     "width) array in the execution space's memory take their owners' rows, in place"},
    {"reverse_exchange", exchange<false>, METH_VARARGS,
     "reverse_exchange(address, nrows, width): ghost rows are summed into their owners' rows "
     "and zeroed, in place"},
    {"allreduce", allreduce, METH_VARARGS,
     "allreduce(values): in-place sum over all ranks of a float64 host buffer"},
    {"transfer", transfer, METH_VARARGS,
     "transfer(send, recv, width, reverse): the plan's rows between ranks, on host buffers "
     "(as pair_style nvalchemi's collectives)"},
    {"ntotal", ntotal, METH_NOARGS, "number of owned + ghost rows"},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot collectives_slots[] = {
    {Py_tp_methods, collectives_methods},
    {Py_tp_doc, const_cast<char *>("KOKKOS communication for one pair compute call")},
    {0, nullptr}};

PyType_Spec collectives_spec = {"nvalchemi_lammps.KokkosCollectives", sizeof(CollectivesObject),
                                0, Py_TPFLAGS_DEFAULT, collectives_slots};

PyObject *collectives_type()
{
  static PyObject *type = nullptr;
  if (!type) type = PyType_FromSpec(&collectives_spec);
  return type;
}

}    // namespace

/* ---------------------------------------------------------------------- */

void NvalchemiLammps::finish_on_device(PythonSession &session)
{
  GilLock gil;
  PyRef module(PyImport_ImportModule(KOKKOS_FRONTEND_MODULE));
  if (!module) raise_pending_python_error("cannot import nvalchemi_lammps: ");
  PyRef out(PyObject_CallMethod(module.get(), "finish", "O",
                                static_cast<PyObject *>(session.python_object())));
  if (!out) raise_pending_python_error("");
}

/* ---------------------------------------------------------------------- */

void NvalchemiLammps::compute_on_device(PythonSession &session, const DeviceStep &step,
                                        DeviceResult &result, DeviceCollectives *collectives)
{
  GilLock gil;
  PyRef module(PyImport_ImportModule(KOKKOS_FRONTEND_MODULE));
  if (!module) raise_pending_python_error("cannot import nvalchemi_lammps: ");
  PyObject *type = collectives_type();
  if (!type) raise_pending_python_error("");
  PyRef comm(PyType_GenericAlloc(reinterpret_cast<PyTypeObject *>(type), 0));
  if (!comm) raise_pending_python_error("");
  // the model may keep a reference; it goes dead when this call returns
  struct Detach {
    PyObject *obj;
    ~Detach() { reinterpret_cast<CollectivesObject *>(obj)->target = nullptr; }
  } detach{comm.get()};
  reinterpret_cast<CollectivesObject *>(comm.get())->target = collectives;

  PyRef fields(PyDict_New());
  if (!fields) raise_pending_python_error("");
  auto put = [&](const char *name, PyObject *value) {
    PyRef owned(value);
    if (!owned || PyDict_SetItemString(fields.get(), name, owned.get()) != 0)
      raise_pending_python_error("");
  };
  put("nlocal", PyLong_FromLong(step.nlocal));
  put("ntotal", PyLong_FromLong(step.ntotal));
  put("positions", capsule(step.positions));
  put("tags", capsule(step.tags));
  put("species", capsule(step.species));
  put("pair_i", capsule(step.pair_i));
  put("pair_j", capsule(step.pair_j));
  put("rij", capsule(step.rij));
  put("forces", capsule(step.forces));
  put("atom_energies", capsule(step.atom_energies));
  put("atom_virials", capsule(step.atom_virials));
  put("pair_virial", PyBool_FromLong(step.pair_virial));
  put("global_virial", PyBool_FromLong(step.global_virial));
  put("read_later", PyBool_FromLong(step.read_later));
  put("timestep", PyLong_FromLongLong(step.timestep));
  put("sink", PyLong_FromLongLong(step.sink));
  put("charges", capsule(step.charges));
  put("cell", Py_BuildValue("(ddddddddd)", step.cell[0], step.cell[1], step.cell[2], step.cell[3],
                            step.cell[4], step.cell[5], step.cell[6], step.cell[7], step.cell[8]));
  put("periodic", Py_BuildValue("(NNN)", PyBool_FromLong(step.periodic[0]),
                                PyBool_FromLong(step.periodic[1]),
                                PyBool_FromLong(step.periodic[2])));
  put("one_rank", PyBool_FromLong(step.one_rank));
  put("owners", capsule(step.owners));
  put("send_rows", capsule(step.send_rows));
  put("nrecv", PyLong_FromLong(step.nrecv));
  Py_INCREF(comm.get());
  put("collectives", comm.get());

  PyRef record_type(PyObject_GetAttrString(module.get(), "KokkosStepRecord"));
  if (!record_type) raise_pending_python_error("");
  PyRef args(PyTuple_New(0));
  if (!args) raise_pending_python_error("");
  PyRef record(PyObject_Call(record_type.get(), args.get(), fields.get()));
  if (!record) raise_pending_python_error("the step record: ");
  PyRef out(PyObject_CallMethod(module.get(), "compute", "OO",
                                static_cast<PyObject *>(session.python_object()), record.get()));
  if (!out) raise_pending_python_error("");
  PyRef energy(PyObject_GetAttrString(out.get(), "energy"));
  PyRef virial(PyObject_GetAttrString(out.get(), "virial"));
  PyRef sink(PyObject_GetAttrString(out.get(), "sink"));
  if (!energy || !virial || !sink)
    raise_pending_python_error("compute must return a KokkosStepResult (energy, virial, sink): ");
  result.sink.generation = -1;
  if (sink.get() != Py_None) {
    unsigned long long pair_i, pair_j, rij, species;
    long long capacity, generation;
    int nlocal;
    if (!PyArg_ParseTuple(sink.get(), "KKKKLiL", &pair_i, &pair_j, &rij, &species, &capacity,
                          &nlocal, &generation))
      raise_pending_python_error("compute's sink: ");
    auto address = [](unsigned long long a) { return reinterpret_cast<void *>(static_cast<uintptr_t>(a)); };
    result.sink.pair_i = address(pair_i);
    result.sink.pair_j = address(pair_j);
    result.sink.rij = address(rij);
    result.sink.species = address(species);
    result.sink.capacity = capacity;
    result.sink.nlocal = nlocal;
    result.sink.generation = generation;
  }
  result.energy = PyFloat_AsDouble(energy.get());
  if (PyErr_Occurred()) raise_pending_python_error("");
  for (int k = 0; k < 6; k++) result.virial[k] = 0.0;
  if (virial.get() != Py_None) {
    if (!PyArg_ParseTuple(virial.get(), "dddddd", &result.virial[0], &result.virial[1],
                          &result.virial[2], &result.virial[3], &result.virial[4],
                          &result.virial[5]))
      raise_pending_python_error("compute's virial: ");
  }
}
