// torch_offload._save_hooks: the saved-tensor hooks of offload_activations as C callables.
//
// Autograd calls a pack hook for every tensor it saves and an unpack hook for every one backward
// reads: several hundred calls per step in modes "all" and "modules". Written in Python, each call
// ran a Python frame and reached our op through torch's generic Python op binding (argument parsing
// against the schema, the result converted back), a few microseconds per call on the step's host
// thread. These hooks call the same ops through the dispatcher from C: the usual case (a plain
// tensor, offloaded, kept or shared by the engine's filter) runs no Python at all. Everything else
// is handed to the Python functions the hooks are built with (activations.py), which decide exactly
// as before: tensor subclasses, weights of offloaded layers, a leaf without grad (the engine asks
// Python whether it is a frozen parameter), errors (named by Python).
//
// Layering: the Python package's C part. It calls the ops (torch_library/) through the dispatcher,
// as Python does, and never the engine (csrc/) directly; from csrc/ it takes only the codes of
// the filter's decisions (csrc/save_decision.h, constants).
#include <ATen/core/dispatch/Dispatcher.h>
#include <Python.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <exception>
#include <new>
#include <tuple>
#include <utility>

#include "pyext/checkpoint_frame.h"
#include "pyext/deferred_saves.h"
#include "pyext/module_types.h"
#include "pyext/offload_ops.h"
#include "pyext/saved_view.h"

namespace {

using torch_offload_pyext::batch_op;
using torch_offload_pyext::DeferredSaves;
using torch_offload_pyext::kKeep;
using torch_offload_pyext::kLeafWithoutGrad;
using torch_offload_pyext::pack_op;
using torch_offload_pyext::SavedView;
using torch_offload_pyext::unpack_op;

// One set of hooks: the manager and filter ids, the filter's min_bytes, the saves held in this
// set's batches, the weight-token registry (a dict that is empty unless layer offloading has
// weights installed), and the Python functions for the rest.
struct SaveHooks {
  PyObject ob_base;  // PyObject_HEAD
  int64_t manager;
  int64_t filter;
  int64_t min_bytes;
  DeferredSaves* deferred;
  PyObject* installed_weights;  // weight_tokens._installed
  PyObject* python_pack;        // any tensor: the Python path (subclasses, weight tokens, ...)
  PyObject* python_leaf;        // a leaf without grad that may be a frozen parameter
  PyObject* python_unpack;      // anything but a SavedView of a plain tensor
  PyObject* on_error;           // an error of our op: raises it, named for the user
};

PyObject* save_hooks_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"manager",           "filter",      "min_bytes",
                                "installed_weights", "python_pack", "python_leaf",
                                "python_unpack",     "on_error",    nullptr};
  long long manager = 0;
  long long filter = 0;
  long long min_bytes = 0;
  PyObject* objects[5] = {};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLLO!OOOO:SaveHooks", const_cast<char**>(names),
                                   &manager, &filter, &min_bytes, &PyDict_Type, &objects[0],
                                   &objects[1], &objects[2], &objects[3], &objects[4])) {
    return nullptr;
  }
  try {
    pack_op();  // the library must be loaded: fail here, not in a hook
    unpack_op();
    batch_op();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
  auto* self = reinterpret_cast<SaveHooks*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->manager = manager;
  self->filter = filter;
  self->min_bytes = min_bytes;
  self->deferred = new (std::nothrow) DeferredSaves();
  if (self->deferred == nullptr) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  PyObject** slots[5] = {&self->installed_weights, &self->python_pack, &self->python_leaf,
                         &self->python_unpack, &self->on_error};
  for (int i = 0; i < 5; ++i) {
    Py_INCREF(objects[i]);
    *slots[i] = objects[i];
  }
  return reinterpret_cast<PyObject*>(self);
}

// SaveHooks holds Python functions, which may refer back to it: it takes part in garbage
// collection.
int save_hooks_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* hooks = reinterpret_cast<SaveHooks*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(hooks->installed_weights);
  Py_VISIT(hooks->python_pack);
  Py_VISIT(hooks->python_leaf);
  Py_VISIT(hooks->python_unpack);
  Py_VISIT(hooks->on_error);
  return 0;
}

int save_hooks_clear(PyObject* self) {
  auto* hooks = reinterpret_cast<SaveHooks*>(self);
  Py_CLEAR(hooks->installed_weights);
  Py_CLEAR(hooks->python_pack);
  Py_CLEAR(hooks->python_leaf);
  Py_CLEAR(hooks->python_unpack);
  Py_CLEAR(hooks->on_error);
  return 0;
}

void save_hooks_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  save_hooks_clear(self);
  delete reinterpret_cast<SaveHooks*>(self)->deferred;  // (held saves stay with autograd)
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

// Sets the Python error for the exception being handled (torch's translation: a c10::ValueError
// becomes a ValueError, an error raised by a Python dispatch mode comes back as it was), then lets
// on_error name it (a node host budget) or re-raise it.
PyObject* raise_named(SaveHooks* hooks) {
  torch::translate_exception_to_python(std::current_exception());
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* value = PyErr_GetRaisedException();
#else
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr) {
    PyException_SetTraceback(value, traceback);
  }
  Py_XDECREF(type);
  Py_XDECREF(traceback);
#endif
  PyObject* result = PyObject_CallOneArg(hooks->on_error, value);
  Py_XDECREF(result);  // on_error always raises; its exception is the one set now
  if (result != nullptr) {
    PyErr_SetString(PyExc_SystemError, "torch_offload: on_error returned instead of raising");
  }
  Py_XDECREF(value);
  return nullptr;
}

// The engine's answer for `t` (tensor), called with `not_a_weight`; nullptr with the error set.
bool call_pack(SaveHooks* hooks, const at::Tensor& tensor, bool not_a_weight,
               std::tuple<at::Tensor, int64_t>& result) {
  try {
    pybind11::gil_scoped_release no_gil;  // the op may wait on the in-flight bound
    result = pack_op().call(tensor, hooks->manager, hooks->filter, not_a_weight);
  } catch (...) {
    raise_named(hooks);
    return false;
  }
  return true;
}

// For a leaf without grad the engine asks whether it is a weight (activations._is_weight): whether
// its base is an nn.Parameter (or a leaf that requires grad). 0 when the base is a plain tensor
// that does not require grad and is not flagged as a parameter (`_is_param`, which isinstance(t,
// Parameter) honours), 1 when Python must look (a Parameter, a subclass, a flag), -1 on error.
int may_be_weight(PyObject* t, const at::Tensor& tensor) {
  const bool view = tensor.is_view();
  const at::TensorBase& base = view ? tensor._base() : static_cast<const at::TensorBase&>(tensor);
  if (base.requires_grad()) return 1;
  PyObject* base_object = view ? THPVariable_Wrap(base) : Py_NewRef(t);
  if (base_object == nullptr) return -1;
  int answer = 0;
  if (Py_TYPE(base_object) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) {
    answer = 1;
  } else if (PyObject** dict = _PyObject_GetDictPtr(base_object);
             dict != nullptr && *dict != nullptr) {
    answer = PyDict_GetItemString(*dict, "_is_param") != nullptr ? 1 : 0;  // Python reads its value
  }
  Py_DECREF(base_object);
  return answer;
}

// Inside this thread's batch a large op output (or a leaf without grad that is no weight) is held,
// and offloaded when the batch ends (deferred_saves.h).
PyObject* hold(SaveHooks* hooks, const at::Tensor& tensor, bool not_a_weight) {
  SavedView* view = torch_offload_pyext::new_saved_view(at::Tensor(), tensor.device());
  if (view == nullptr) return nullptr;
  view->held = tensor;
  view->held_version = tensor._version();
  view->pending = true;
  view->not_a_weight = not_a_weight;
  hooks->deferred->add(view);
  return reinterpret_cast<PyObject*>(view);
}

PyObject* save_hooks_pack(PyObject* self, PyObject* t) {
  auto* hooks = reinterpret_cast<SaveHooks*>(self);
  if (Py_TYPE(t) != reinterpret_cast<PyTypeObject*>(THPVariableClass) ||
      PyDict_GET_SIZE(hooks->installed_weights) != 0) {
    return PyObject_CallOneArg(hooks->python_pack, t);
  }
  const at::Tensor& tensor = THPVariable_Unpack(t);
  if (hooks->deferred->holding()) {
    using torch_offload_pyext::Holdable;
    switch (torch_offload_pyext::holdable(tensor, hooks->min_bytes)) {
      case Holdable::kOpOutput:
        return hold(hooks, tensor, false);
      case Holdable::kLeafWithoutGrad: {
        const int weight = may_be_weight(t, tensor);
        if (weight < 0) return nullptr;
        if (weight == 0) return hold(hooks, tensor, true);
        break;  // perhaps a frozen parameter: decided below, as outside a batch
      }
      case Holdable::kNo:
        break;
    }
  }
  std::tuple<at::Tensor, int64_t> result;
  if (!call_pack(hooks, tensor, false, result)) return nullptr;
  if (std::get<1>(result) == kLeafWithoutGrad) {
    // A leaf without grad (rotary cos / sin, or a frozen parameter outside `keep`).
    const int weight = may_be_weight(t, tensor);
    if (weight != 0) return weight < 0 ? nullptr : PyObject_CallOneArg(hooks->python_leaf, t);
    if (!call_pack(hooks, tensor, true, result)) return nullptr;
  }
  const auto& [save, decision] = result;
  if (save.defined()) {
    return reinterpret_cast<PyObject*>(torch_offload_pyext::new_saved_view(save, tensor.device()));
  }
  if (decision == kKeep) {
    return Py_NewRef(t);
  }
  return PyObject_CallOneArg(hooks->python_pack, t);  // a tensor the engine leaves to the caller
}

PyObject* save_hooks_unpack(PyObject* self, PyObject* packed) {
  auto* hooks = reinterpret_cast<SaveHooks*>(self);
  if (Py_TYPE(packed) == reinterpret_cast<PyTypeObject*>(THPVariableClass)) {
    return Py_NewRef(packed);  // kept on the device: saved as itself
  }
  if (!torch_offload_pyext::is_saved_view(packed) ||
      reinterpret_cast<SavedView*>(packed)->dtensor_spec != Py_None) {
    return PyObject_CallOneArg(hooks->python_unpack, packed);
  }
  auto* view = reinterpret_cast<SavedView*>(packed);
  at::Tensor restored;
  try {
    if (!view->save.defined() && view->held.defined()) {
      // Held: its batch is still open, or the engine kept it on the device.
      return THPVariable_Wrap(torch_offload_pyext::held_tensor(*view));
    }
    pybind11::gil_scoped_release no_gil;  // the op may wait for its copy
    restored = unpack_op().call(view->save, view->device, hooks->manager);
  } catch (...) {
    return raise_named(hooks);
  }
  return THPVariable_Wrap(std::move(restored));
}

// offload_batch: begin, or end and issue, a batch of this thread's copies (offload_activations'
// batch_copies: modules mode, per selected module call). The saves held in the batch go to the
// engine before its end issues the copies.
PyObject* save_hooks_batch(PyObject* self, bool begin) {
  auto* hooks = reinterpret_cast<SaveHooks*>(self);
  std::exception_ptr held_error;
  if (begin) {
    hooks->deferred->begin();
  } else if (hooks->deferred->end()) {
    held_error =
        torch_offload_pyext::offload_held(hooks->deferred->take(), hooks->manager, hooks->filter);
  }
  try {
    {
      pybind11::gil_scoped_release no_gil;  // issuing waits on the in-flight bound
      batch_op().call(hooks->manager, begin);
    }
    if (held_error) std::rethrow_exception(held_error);
  } catch (...) {
    return raise_named(hooks);
  }
  Py_RETURN_NONE;
}

PyObject* save_hooks_begin_batch(PyObject* self, PyObject*) { return save_hooks_batch(self, true); }

PyObject* save_hooks_end_batch(PyObject* self, PyObject*) { return save_hooks_batch(self, false); }

PyMethodDef save_hooks_methods[] = {
    {"pack", save_hooks_pack, METH_O, "the pack hook: what autograd keeps for a saved tensor"},
    {"unpack", save_hooks_unpack, METH_O, "the unpack hook: the saved tensor again"},
    {"begin_batch", save_hooks_begin_batch, METH_NOARGS,
     "this thread's saves queue their copies (offload_batch)"},
    {"end_batch", save_hooks_end_batch, METH_NOARGS, "issues the queued copies (offload_batch)"},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot save_hooks_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(save_hooks_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(save_hooks_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(save_hooks_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(save_hooks_clear)},
    {Py_tp_methods, save_hooks_methods},
    {Py_tp_doc,
     const_cast<char*>("pack / unpack hooks of one offload_activations (see activations.py)")},
    {0, nullptr}};
PyType_Spec save_hooks_spec = {"torch_offload._save_hooks.SaveHooks", sizeof(SaveHooks), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, save_hooks_slots};

PyModuleDef module_def{};  // filled in PyInit__save_hooks (C++17 has no designated initializers)

}  // namespace

PyMODINIT_FUNC PyInit__save_hooks() {
  module_def.m_base = PyModuleDef_HEAD_INIT;
  module_def.m_name = "_save_hooks";
  module_def.m_doc =
      "The save hooks of torch_offload.offload_activations, in C (pyext/save_hooks.cpp).";
  module_def.m_size = -1;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) {
    return nullptr;
  }
  if (!torch_offload_pyext::add_saved_view(module) ||
      torch_offload_pyext::add_type(module, &save_hooks_spec, "SaveHooks") == nullptr ||
      !torch_offload_pyext::add_checkpoint_frame(module)) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
