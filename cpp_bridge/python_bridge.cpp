/* ----------------------------------------------------------------------
   nvalchemi-lammps: embedded Python for pair_style nvalchemi.

   When LAMMPS runs as a plain executable, the interpreter of the environment
   nvalchemi-lammps is installed in is started here; when LAMMPS is driven from
   Python, the running interpreter is reused. Every entry takes the GIL.
------------------------------------------------------------------------- */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "python_bridge.h"
#include "python_ref.h"

#include <cstdlib>
#include <dlfcn.h>

using namespace NvalchemiLammps;

namespace {

constexpr const char *FRONTEND_MODULE = "nvalchemi_lammps.frontends.plugin";
constexpr const char *TORCH_BLAS_MODULE = "nvalchemi_lammps._torch_blas";
// The step record's version (STEP_PROTOCOL in nvalchemi_lammps/frontends/_step.py): bumped
// on both sides with every change of its fields or of what the session's calls return
constexpr long STEP_PROTOCOL = 5;

std::string fmt_protocol_mismatch(long python_protocol)
{
  return "this pair style plugin speaks step protocol " + std::to_string(STEP_PROTOCOL) +
      " and the installed nvalchemi_lammps Python package " +
      (python_protocol < 0 ? std::string("none") : std::to_string(python_protocol)) +
      ": the plugin and the package come from different versions; reinstall the package "
      "(pip install --no-build-isolation nvalchemi-lammps, or make setup) and load the "
      "plugin it installs (nvalchemi-lammps info shows its path)";
}
constexpr const char *PYTHON_ENV_VAR = "NVALCHEMI_LAMMPS_PYTHON";

/* ----------------------------------------------------------------------
   the formatted traceback of an exception object, "" if it cannot be had
------------------------------------------------------------------------- */

std::string format_traceback(PyObject *value)
{
  PyRef module(PyImport_ImportModule("traceback"));
  PyRef lines(module ? PyObject_CallMethod(module.get(), "format_exception", "O", value) : nullptr);
  PyRef empty(PyUnicode_FromString(""));
  PyRef joined(lines && empty ? PyUnicode_Join(empty.get(), lines.get()) : nullptr);
  const char *text = joined ? PyUnicode_AsUTF8(joined.get()) : nullptr;
  std::string result = text ? text : "";
  PyErr_Clear();
  return result;
}

/* ----------------------------------------------------------------------
   turn the pending Python exception, BaseException included, into a
   PythonError with its type and message. Never PyErr_Print(): on SystemExit
   it ends the process without a word. Errors the user can fix (ValueError,
   OSError, ImportError) keep to one line; anything else also carries its
   traceback, for the pair style to log.
------------------------------------------------------------------------- */

[[noreturn]] void raise_python_error(const std::string &context)
{
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  std::string text = "unknown Python error", trace, name;
  if (type && value) {
    name = reinterpret_cast<PyTypeObject *>(type)->tp_name;
    if (traceback) PyException_SetTraceback(value, traceback);
    const bool expected = PyErr_GivenExceptionMatches(type, PyExc_ValueError) ||
        PyErr_GivenExceptionMatches(type, PyExc_OSError) ||
        PyErr_GivenExceptionMatches(type, PyExc_ImportError);
    PyRef str(PyObject_Str(value));
    const char *message = str ? PyUnicode_AsUTF8(str.get()) : nullptr;
    PyErr_Clear();
    text = message ? message : "";
    if (!expected) {
      text = text.empty() ? name : name + ": " + text;
      trace = format_traceback(value);
    }
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  PyErr_Clear();
  throw PythonError(context + text, trace, name);
}

/* ----------------------------------------------------------------------
   the Cython modules of LAMMPS's ML-IAP (PYTHON package) are built into
   liblammps and reach Python only through the table of built-in modules,
   which LAMMPS fills just before it starts the interpreter itself and which
   is read once, at the start. Starting Python here first would leave
   `pair_style mliap unified` and `mliap model mliappy` later in the same
   input unable to import them: register those that this LAMMPS has. An lmp
   executable links liblammps, so its symbols are in the global namespace.
------------------------------------------------------------------------- */

void register_lammps_modules()
{
  for (const char *name : {"mliap_model_python_couple", "mliap_unified_couple",
                           "mliap_model_python_couple_kokkos", "mliap_unified_couple_kokkos"}) {
    const std::string init = std::string("PyInit_") + name;
    if (void *symbol = dlsym(RTLD_DEFAULT, init.c_str()))
      PyImport_AppendInittab(name, reinterpret_cast<PyObject *(*) ()>(symbol));
  }
}

/* ----------------------------------------------------------------------
   start the interpreter once per process if nobody has
------------------------------------------------------------------------- */

void start_python()
{
  if (Py_IsInitialized()) return;

  // The plugin was dlopen()-ed privately; extension modules (numpy, torch)
  // resolve the C API from the global namespace, so promote libpython there.
  Dl_info info;
  if (dladdr(reinterpret_cast<void *>(&Py_IsInitialized), &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);

  // The interpreter of the environment nvalchemi-lammps is installed in:
  // the lammps launcher names it, else the one the plugin was built with.
  const char *executable = std::getenv(PYTHON_ENV_VAR);
  if (!executable || !*executable) executable = NVALCHEMI_PYTHON_EXECUTABLE;

  register_lammps_modules();
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.install_signal_handlers = 0;    // LAMMPS and MPI own the signals
  config.parse_argv = 0;
  PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, executable);
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status))
    throw PythonError(std::string("cannot start Python ") + executable + ": " +
                      (status.err_msg ? status.err_msg : "unknown error"));
  // The main thread keeps the GIL (GilLock nests), as LAMMPS's PYTHON package does: in a
  // LAMMPS that has it, its Py_Finalize() at exit runs on the main thread and needs it.
}

PyObject *writable_view(const void *data, size_t nbytes)
{
  static char empty = 0;
  char *ptr = nbytes ? static_cast<char *>(const_cast<void *>(data)) : &empty;
  return PyMemoryView_FromMemory(ptr, static_cast<Py_ssize_t>(nbytes), PyBUF_WRITE);
}

/* ----------------------------------------------------------------------
   LammpsCollectives: the Python face of a Collectives object, valid only
   during one PythonSession::compute() call
------------------------------------------------------------------------- */

struct CollectivesObject {
  PyObject_HEAD Collectives *target;
};

// writable C-contiguous float64 buffer of `count` values (count < 0: any)
bool get_rows(PyObject *obj, Py_buffer *view, Py_ssize_t count)
{
  if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
    return false;
  if (view->itemsize != sizeof(double) || !view->format || std::string(view->format) != "d") {
    PyBuffer_Release(view);
    PyErr_SetString(PyExc_TypeError, "LAMMPS collectives need a float64 buffer");
    return false;
  }
  if (count >= 0 && view->len != count * static_cast<Py_ssize_t>(sizeof(double))) {
    PyErr_Format(PyExc_ValueError, "LAMMPS collectives got %zd values, wanted %zd",
                 view->len / static_cast<Py_ssize_t>(sizeof(double)), count);
    PyBuffer_Release(view);
    return false;
  }
  return true;
}

Collectives *live_target(PyObject *self)
{
  Collectives *target = reinterpret_cast<CollectivesObject *>(self)->target;
  if (!target)
    PyErr_SetString(PyExc_RuntimeError,
                    "LAMMPS collectives used outside of the pair style's compute call");
  return target;
}

template <bool FORWARD> PyObject *exchange(PyObject *self, PyObject *args)
{
  PyObject *buffer;
  int width;
  if (!PyArg_ParseTuple(args, "Oi", &buffer, &width)) return nullptr;
  Collectives *target = live_target(self);
  if (!target) return nullptr;
  if (width < 1) return PyErr_Format(PyExc_ValueError, "exchange width must be >= 1, got %d", width);
  Py_buffer view;
  if (!get_rows(buffer, &view, static_cast<Py_ssize_t>(target->ntotal()) * width)) return nullptr;
  double *rows = static_cast<double *>(view.buf);
  // the exchange is MPI only: other threads may run Python meanwhile
  Py_BEGIN_ALLOW_THREADS;
  if (FORWARD)
    target->forward_exchange(rows, width);
  else
    target->reverse_exchange(rows, width);
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&view);
  Py_RETURN_NONE;
}

PyObject *allreduce(PyObject *self, PyObject *args)
{
  PyObject *buffer;
  if (!PyArg_ParseTuple(args, "O", &buffer)) return nullptr;
  Collectives *target = live_target(self);
  if (!target) return nullptr;
  Py_buffer view;
  if (!get_rows(buffer, &view, -1)) return nullptr;
  const int count = static_cast<int>(view.len / static_cast<Py_ssize_t>(sizeof(double)));
  double *values = static_cast<double *>(view.buf);
  Py_BEGIN_ALLOW_THREADS;
  target->allreduce(values, count);
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&view);
  Py_RETURN_NONE;
}

// C-contiguous float64 or float32 buffer of exactly `count` values; `single` says which
bool get_values(PyObject *obj, Py_buffer *view, int flags, Py_ssize_t count, bool *single)
{
  if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return false;
  const std::string format = view->format ? view->format : "";
  *single = format == "f";
  if (!*single && format != "d") {
    PyBuffer_Release(view);
    PyErr_SetString(PyExc_TypeError, "LAMMPS transfers need a float64 or float32 buffer");
    return false;
  }
  if (view->len != count * view->itemsize) {
    PyErr_Format(PyExc_ValueError, "LAMMPS transfer got %zd values, wanted %zd",
                 view->len / view->itemsize, count);
    PyBuffer_Release(view);
    return false;
  }
  return true;
}

PyObject *transfer(PyObject *self, PyObject *args)
{
  Collectives *target = live_target(self);
  return target ? call_transfer(target, args) : nullptr;
}

PyObject *ntotal(PyObject *self, PyObject *)
{
  Collectives *target = live_target(self);
  if (!target) return nullptr;
  return PyLong_FromLong(target->ntotal());
}

PyMethodDef collectives_methods[] = {
    {"forward_exchange", exchange<true>, METH_VARARGS,
     "forward_exchange(rows, width): ghost rows of a float64 (ntotal, width) buffer take "
     "their owners' rows, in place"},
    {"reverse_exchange", exchange<false>, METH_VARARGS,
     "reverse_exchange(rows, width): ghost rows are summed into their owners' rows and "
     "zeroed, in place"},
    {"allreduce", allreduce, METH_VARARGS, "allreduce(values): in-place sum over all ranks"},
    {"transfer", transfer, METH_VARARGS,
     "transfer(send, recv, width, reverse): rows between ranks by the exchange plan, float64 "
     "or float32 buffers (forward: nsend rows out, nrecv in; reverse: the other way round)"},
    {"ntotal", ntotal, METH_NOARGS, "number of owned + ghost rows"},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot collectives_slots[] = {
    {Py_tp_methods, collectives_methods},
    {Py_tp_doc, const_cast<char *>("LAMMPS communication for one pair compute call")},
    {0, nullptr}};

PyType_Spec collectives_spec = {"nvalchemi_lammps.LammpsCollectives",
                                sizeof(CollectivesObject), 0, Py_TPFLAGS_DEFAULT,
                                collectives_slots};

PyObject *collectives_type()
{
  static PyObject *type = nullptr;
  if (!type) type = PyType_FromSpec(&collectives_spec);
  return type;
}

}    // namespace

/* ---------------------------------------------------------------------- */

PyObject *NvalchemiLammps::call_transfer(PlanTransfer *target, PyObject *args)
{
  PyObject *send_obj, *recv_obj;
  int width, reverse;
  if (!PyArg_ParseTuple(args, "OOip", &send_obj, &recv_obj, &width, &reverse)) return nullptr;
  if (width < 1) return PyErr_Format(PyExc_ValueError, "transfer width must be >= 1, got %d", width);
  const Py_ssize_t out = reverse ? target->nrecv() : target->nsend();
  const Py_ssize_t in = reverse ? target->nsend() : target->nrecv();
  Py_buffer send, recv;
  bool send_single = false, recv_single = false;
  if (!get_values(send_obj, &send, PyBUF_SIMPLE, out * width, &send_single)) return nullptr;
  if (!get_values(recv_obj, &recv, PyBUF_WRITABLE, in * width, &recv_single)) {
    PyBuffer_Release(&send);
    return nullptr;
  }
  if (send_single != recv_single) {
    PyBuffer_Release(&send);
    PyBuffer_Release(&recv);
    PyErr_SetString(PyExc_TypeError, "LAMMPS transfer buffers differ in precision");
    return nullptr;
  }
  Py_BEGIN_ALLOW_THREADS;
  target->transfer(send.buf, recv.buf, width, send_single, reverse != 0);
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&send);
  PyBuffer_Release(&recv);
  Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------- */

PythonSession::PythonSession(const std::string &model_path, int num_threads,
                             const std::string &device, int local_rank) :
    session_(nullptr), cutoff_(0.0), layers_(1), needs_positions_(false), strategy_("local"), ghost_cutoff_(0.0), step_type_(nullptr),
    on_device_(false), digest_verified_(false)
{
  start_python();
  GilLock gil;
  // before anything imports torch: torch calls its own BLAS, not the one LAMMPS exports
  PyRef blas(PyImport_ImportModule(TORCH_BLAS_MODULE));
  if (!blas) raise_python_error("cannot import nvalchemi_lammps: ");
  PyRef loaded(PyObject_CallMethod(blas.get(), "load_torch", nullptr));
  if (!loaded) raise_python_error("");
  PyRef module(PyImport_ImportModule(FRONTEND_MODULE));
  if (!module) raise_python_error("cannot import nvalchemi_lammps: ");
  // the plugin and the package must speak the same step record: refuse a mismatched pair
  PyRef protocol(PyObject_GetAttrString(module.get(), "STEP_PROTOCOL"));
  const long python_protocol = protocol ? PyLong_AsLong(protocol.get()) : -1;
  PyErr_Clear();
  if (python_protocol != STEP_PROTOCOL)
    throw PythonError(fmt_protocol_mismatch(python_protocol));
  PyRef step_type(PyObject_GetAttrString(module.get(), "StepRecord"));
  if (!step_type) raise_python_error("");
  PyRef session(PyObject_CallMethod(module.get(), "open_session", "sisi", model_path.c_str(),
                                    num_threads, device.c_str(), local_rank));
  if (!session) raise_python_error("");

  PyRef layers(PyObject_GetAttrString(session.get(), "layers"));
  if (!layers) raise_python_error("");
  layers_ = static_cast<int>(PyLong_AsLong(layers.get()));
  PyRef needs_positions(PyObject_GetAttrString(session.get(), "needs_positions"));
  if (!needs_positions) raise_python_error("");
  needs_positions_ = PyObject_IsTrue(needs_positions.get()) == 1;
  PyRef on_device(PyObject_GetAttrString(session.get(), "on_device"));
  if (!on_device) raise_python_error("");
  on_device_ = PyObject_IsTrue(on_device.get()) == 1;
  PyRef units(PyObject_GetAttrString(session.get(), "units"));
  PyRef description(PyObject_CallMethod(session.get(), "describe", nullptr));
  if (!units || !description) raise_python_error("");
  const char *units_text = PyUnicode_AsUTF8(units.get());
  const char *description_text = PyUnicode_AsUTF8(description.get());
  if (PyErr_Occurred() || !units_text || !description_text) raise_python_error("");
  units_ = units_text;
  description_ = description_text;
  PyRef digest(PyObject_GetAttrString(session.get(), "digest"));
  PyRef verified(PyObject_GetAttrString(session.get(), "digest_verified"));
  const char *digest_text = digest ? PyUnicode_AsUTF8(digest.get()) : nullptr;
  if (!digest_text || !verified) raise_python_error("");
  digest_ = digest_text;
  digest_verified_ = PyObject_IsTrue(verified.get()) == 1;

  Py_INCREF(session.get());
  session_ = session.get();
  Py_INCREF(step_type.get());
  step_type_ = step_type.get();
}

/* ---------------------------------------------------------------------- */

PythonSession::~PythonSession()
{
  if (!session_ || !Py_IsInitialized()) return;
  GilLock gil;
  Py_DECREF(static_cast<PyObject *>(session_));
  Py_XDECREF(static_cast<PyObject *>(step_type_));
}

/* ---------------------------------------------------------------------- */

void PythonSession::set_strategy(const std::string &strategy)
{
  GilLock gil;
  PyObject *session = static_cast<PyObject *>(session_);
  PyRef done(PyObject_CallMethod(session, "set_strategy", "s", strategy.c_str()));
  if (!done) raise_python_error("");
  // the decision is Python's (contract.resolve_strategy); the pair style only reads it
  PyRef name(PyObject_GetAttrString(session, "strategy"));
  const char *text = name ? PyUnicode_AsUTF8(name.get()) : nullptr;
  if (!text) raise_python_error("");
  strategy_ = text;
  PyRef cutoff(PyObject_GetAttrString(session, "cutoff"));
  PyRef ghost(PyObject_GetAttrString(session, "ghost_cutoff"));
  if (!cutoff || !ghost) raise_python_error("");
  cutoff_ = PyFloat_AsDouble(cutoff.get());
  ghost_cutoff_ = PyFloat_AsDouble(ghost.get());
  if (PyErr_Occurred()) raise_python_error("");
}

/* ---------------------------------------------------------------------- */

void PythonSession::set_system_state(double charge, int spin, const std::string &task)
{
  GilLock gil;
  PyRef done(PyObject_CallMethod(static_cast<PyObject *>(session_), "set_system_state", "dis",
                                 charge, spin, task.c_str()));
  if (!done) raise_python_error("");
}

/* ---------------------------------------------------------------------- */

void PythonSession::check_box(bool xperiodic, bool yperiodic, bool zperiodic)
{
  GilLock gil;
  PyRef done(PyObject_CallMethod(static_cast<PyObject *>(session_), "check_box", "((NNN))",
                                 PyBool_FromLong(xperiodic), PyBool_FromLong(yperiodic),
                                 PyBool_FromLong(zperiodic)));
  if (!done) raise_python_error("");
}

/* ---------------------------------------------------------------------- */

std::string PythonSession::set_compile(const std::string &mode)
{
  GilLock gil;
  PyRef summary(
      PyObject_CallMethod(static_cast<PyObject *>(session_), "set_compile", "s", mode.c_str()));
  if (!summary) raise_python_error("");
  const char *text = PyUnicode_AsUTF8(summary.get());
  if (!text) raise_python_error("set_compile: ");
  return text;
}

/* ---------------------------------------------------------------------- */

std::string PythonSession::set_capture(const std::string &mode)
{
  GilLock gil;
  PyRef summary(
      PyObject_CallMethod(static_cast<PyObject *>(session_), "set_capture", "s", mode.c_str()));
  if (!summary) raise_python_error("");
  const char *text = PyUnicode_AsUTF8(summary.get());
  if (!text) raise_python_error("set_capture: ");
  return text;
}

/* ---------------------------------------------------------------------- */

bool PythonSession::half_pairs()
{
  GilLock gil;
  PyRef half(PyObject_GetAttrString(static_cast<PyObject *>(session_), "half_pairs"));
  if (!half) raise_python_error("half_pairs: ");
  const int answer = PyObject_IsTrue(half.get());
  if (answer < 0) raise_python_error("half_pairs: ");
  return answer == 1;
}

/* ---------------------------------------------------------------------- */

PythonSession::CompileStatus PythonSession::compile_status()
{
  GilLock gil;
  PyRef status(PyObject_CallMethod(static_cast<PyObject *>(session_), "compile_status", nullptr));
  if (!status) raise_python_error("");
  CompileStatus result{-1, 0, 0, 0.0};
  if (!PyArg_ParseTuple(status.get(), "llld", &result.graphs, &result.atoms, &result.pairs,
                        &result.seconds))
    raise_python_error("compile_status: ");
  return result;
}

/* ---------------------------------------------------------------------- */

std::string PythonSession::capture_notes()
{
  GilLock gil;
  PyRef why(PyObject_CallMethod(static_cast<PyObject *>(session_), "capture_notes", nullptr));
  if (!why) raise_python_error("");
  const char *text = PyUnicode_AsUTF8(why.get());
  if (!text) raise_python_error("capture_notes: ");
  return text;
}

/* ---------------------------------------------------------------------- */

std::vector<int> PythonSession::map_types(const std::vector<std::string> &names)
{
  GilLock gil;
  PyRef list(PyList_New(static_cast<Py_ssize_t>(names.size())));
  if (!list) raise_python_error("");
  for (size_t k = 0; k < names.size(); ++k)
    PyList_SET_ITEM(list.get(), k, PyUnicode_FromString(names[k].c_str()));
  PyRef mapped(
      PyObject_CallMethod(static_cast<PyObject *>(session_), "map_types", "O", list.get()));
  if (!mapped) raise_python_error("");

  std::vector<int> result;
  PyRef seq(PySequence_Fast(mapped.get(), "map_types must return a sequence"));
  if (!seq) raise_python_error("");
  for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq.get()); ++k)
    result.push_back(static_cast<int>(PyLong_AsLong(PySequence_Fast_GET_ITEM(seq.get(), k))));
  if (PyErr_Occurred()) raise_python_error("");
  return result;
}

/* ---------------------------------------------------------------------- */

void PythonSession::compute(const Step &step, Result &result, Collectives *collectives)
{
  GilLock gil;
  PyObject *type = collectives_type();
  if (!type) raise_python_error("");
  PyRef comm(PyType_GenericAlloc(reinterpret_cast<PyTypeObject *>(type), 0));
  if (!comm) raise_python_error("");
  // the model may keep a reference; it goes dead when this call returns
  struct Detach {
    PyObject *obj;
    ~Detach() { reinterpret_cast<CollectivesObject *>(obj)->target = nullptr; }
  } detach{comm.get()};
  reinterpret_cast<CollectivesObject *>(comm.get())->target = collectives;

  const size_t n = static_cast<size_t>(step.ntotal);
  const size_t slots = static_cast<size_t>(step.capacity);
  PyRef positions(writable_view(step.positions, sizeof(double) * 3 * n));
  PyRef pair_i(writable_view(step.pair_i, sizeof(int64_t) * slots));
  PyRef pair_j(writable_view(step.pair_j, sizeof(int64_t) * slots));
  PyRef rij(writable_view(step.rij, sizeof(double) * 3 * slots));
  PyRef pair_forces(writable_view(result.pair_forces, sizeof(double) * 3 * slots));
  // no scalar slots (a caller that predates them): the model gives pair force vectors
  PyRef pair_scalars(result.pair_scalars
                         ? writable_view(result.pair_scalars, sizeof(double) * slots)
                         : Py_NewRef(Py_None));
  PyRef energies(writable_view(result.atom_energies, sizeof(double) * n));
  PyRef atom_forces(writable_view(result.atom_forces, sizeof(double) * 3 * n));
  if (!positions || !pair_i || !pair_j || !rij || !pair_forces || !pair_scalars || !energies ||
      !atom_forces)
    raise_python_error("");

  // the step record (frontends/_step.py, StepRecord), field by field, by name
  PyRef fields(PyDict_New());
  if (!fields) raise_python_error("");
  auto put = [&](const char *name, PyObject *value) {
    PyRef owned(value);    // a new reference, or nullptr after a Python error
    if (!owned || PyDict_SetItemString(fields.get(), name, owned.get()) != 0)
      raise_python_error("");
  };
  auto none = []() {
    Py_INCREF(Py_None);
    return Py_None;
  };
  auto view_or_none = [&](const void *data, size_t nbytes) {
    return data ? writable_view(data, nbytes) : none();
  };
  put("nlocal", PyLong_FromLong(step.nlocal));
  put("ntotal", PyLong_FromLong(step.ntotal));
  Py_INCREF(positions.get());
  put("positions", positions.get());
  const bool plan = step.new_topology && step.owner;
  put("species", step.new_topology ? writable_view(step.species, sizeof(int64_t) * n) : none());
  put("owner", plan ? writable_view(step.owner, sizeof(int64_t) * n) : none());
  put("send_rows", plan ? writable_view(step.send_rows, sizeof(int64_t) * step.nsend) : none());
  put("nsend", PyLong_FromLong(plan ? step.nsend : 0));
  put("nrecv", PyLong_FromLong(plan ? step.nrecv : 0));
  put("remote", PyBool_FromLong(plan && step.remote));
  put("npairs", PyLong_FromLong(step.npairs));
  put("filtered", PyBool_FromLong(step.filtered));
  put("capacity", PyLong_FromLong(step.capacity));
  for (PyObject *view : {pair_i.get(), pair_j.get(), rij.get(), pair_forces.get(),
                         pair_scalars.get(), energies.get(), atom_forces.get(), comm.get()})
    Py_INCREF(view);
  put("pair_i", pair_i.get());
  put("pair_j", pair_j.get());
  put("rij", rij.get());
  put("pair_forces", pair_forces.get());
  put("pair_scalars", pair_scalars.get());
  put("want_pairs", PyBool_FromLong(step.want_pairs));
  put("half_pairs", PyBool_FromLong(step.half_pairs));
  put("want_atom_energies", PyBool_FromLong(step.want_atom_energies));
  put("atom_energies", energies.get());
  put("atom_forces", atom_forces.get());
  put("collectives", comm.get());
  put("tags", writable_view(step.tags, static_cast<size_t>(step.tag_bytes) * n));
  put("tag_bytes", PyLong_FromLong(step.tag_bytes));
  put("timestep", PyLong_FromLongLong(step.timestep));
  // what a model with needs_positions() reads besides the pairs, and its virial out
  if (needs_positions_) {
    put("charges", view_or_none(step.charges, sizeof(double) * n));
    put("cell", writable_view(step.cell, sizeof(double) * 9));
    put("periodic", Py_BuildValue("(NNN)", PyBool_FromLong(step.periodic[0]),
                                  PyBool_FromLong(step.periodic[1]),
                                  PyBool_FromLong(step.periodic[2])));
    put("virial", writable_view(result.virial, sizeof(double) * 6));
  }
  PyRef args(PyTuple_New(0));
  if (!args) raise_python_error("");
  PyRef record(PyObject_Call(static_cast<PyObject *>(step_type_), args.get(), fields.get()));
  if (!record) raise_python_error("the step record: ");
  PyRef out(PyObject_CallMethod(static_cast<PyObject *>(session_), "compute", "O", record.get()));
  if (!out) raise_python_error("");
  PyRef energy(PyObject_GetAttrString(out.get(), "energy"));
  PyRef npairs(PyObject_GetAttrString(out.get(), "npairs"));
  PyRef written(PyObject_GetAttrString(out.get(), "atom_forces_written"));
  PyRef scalars(PyObject_GetAttrString(out.get(), "pair_scalars_written"));
  PyRef nonfinite(PyObject_GetAttrString(out.get(), "nonfinite"));
  if (!energy || !npairs || !written || !scalars || !nonfinite)
    raise_python_error("compute must return a StepResult (energy, npairs, atom_forces_written, "
                       "pair_scalars_written, nonfinite): ");
  const char *report = PyUnicode_AsUTF8(nonfinite.get());
  if (!report) raise_python_error("nonfinite: ");
  result.nonfinite = report;
  result.energy = PyFloat_AsDouble(energy.get());
  const long back = PyLong_AsLong(npairs.get());
  if (PyErr_Occurred()) raise_python_error("");
  if (back < 0 || back > step.capacity)
    throw PythonError("compute returned more pairs than there are slots");
  result.npairs = static_cast<int>(back);
  result.atom_forces_written = PyObject_IsTrue(written.get()) == 1;
  result.pair_scalars_written = PyObject_IsTrue(scalars.get()) == 1;
}

/* ---------------------------------------------------------------------- */

void NvalchemiLammps::raise_pending_python_error(const std::string &context)
{
  raise_python_error(context);
}
