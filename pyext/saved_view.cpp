// torch_offload._save_hooks.SavedView (saved_view.h): made by the C pack hook, or from Python
// (SavedView(save, device): the Python path's offloaded saves), read by the unpack hooks.
#include "pyext/saved_view.h"

#include <structmember.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/autograd/python_variable.h>

#include <new>
#include <utility>

#include "pyext/module_types.h"

namespace torch_offload_pyext {
namespace {

PyTypeObject* saved_view_type = nullptr;  // made in add_saved_view

SavedView* make_saved_view(PyTypeObject* type, at::Tensor save, c10::Device device) {
  auto* view = reinterpret_cast<SavedView*>(type->tp_alloc(type, 0));
  if (view == nullptr) {
    return nullptr;
  }
  new (&view->save) at::Tensor(std::move(save));
  new (&view->device) c10::Device(device);
  new (&view->held) at::Tensor();
  view->dtensor_spec = Py_NewRef(Py_None);
  view->held_version = 0;
  view->pending = false;
  view->not_a_weight = false;
  return view;
}

PyObject* saved_view_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"save", "device", nullptr};
  PyObject* save = nullptr;
  PyObject* device = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:SavedView", const_cast<char**>(names), &save,
                                   &device)) {
    return nullptr;
  }
  if (!THPVariable_Check(save) || !THPDevice_Check(device)) {
    PyErr_SetString(PyExc_TypeError,
                    "SavedView(save, device): save must be a tensor and device a torch.device");
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(make_saved_view(type, THPVariable_Unpack(save),
                                                     reinterpret_cast<THPDevice*>(device)->device));
}

void saved_view_dealloc(PyObject* self) {
  auto* view = reinterpret_cast<SavedView*>(self);
  view->save.~Tensor();
  view->held.~Tensor();
  Py_XDECREF(view->dtensor_spec);
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);  // a heap type: each instance holds a reference
}

PyObject* saved_view_save(PyObject* self, void*) {
  return THPVariable_Wrap(reinterpret_cast<SavedView*>(self)->save);  // None while held
}

PyObject* saved_view_device(PyObject* self, void*) {
  return THPDevice_New(reinterpret_cast<SavedView*>(self)->device);
}

PyObject* saved_view_pending(PyObject* self, void*) {
  return PyBool_FromLong(reinterpret_cast<SavedView*>(self)->pending);
}

PyGetSetDef saved_view_getset[] = {
    {"save", saved_view_save, nullptr, "the save handle (a host tensor), None while held", nullptr},
    {"device", saved_view_device, nullptr, "the device the save is restored to", nullptr},
    {"pending", saved_view_pending, nullptr,
     "held until the batch of its selected module call ends", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMemberDef saved_view_members[] = {
    {"dtensor_spec", T_OBJECT, offsetof(SavedView, dtensor_spec), 0, "a DTensor's spec, or None"},
    {nullptr, 0, 0, 0, nullptr}};

const char saved_view_doc[] =
    "What autograd keeps for one offloaded save: its save handle (a host tensor with the save's "
    "dtype, sizes and strides on the storage of the copy holding its elements), its device, and a "
    "DTensor's spec when it is a local shard.";

PyType_Slot saved_view_slots[] = {{Py_tp_new, reinterpret_cast<void*>(saved_view_new)},
                                  {Py_tp_dealloc, reinterpret_cast<void*>(saved_view_dealloc)},
                                  {Py_tp_members, saved_view_members},
                                  {Py_tp_getset, saved_view_getset},
                                  {Py_tp_doc, const_cast<char*>(saved_view_doc)},
                                  {0, nullptr}};
PyType_Spec saved_view_spec = {"torch_offload._save_hooks.SavedView", sizeof(SavedView), 0,
                               Py_TPFLAGS_DEFAULT, saved_view_slots};

}  // namespace

bool add_saved_view(PyObject* module) {
  saved_view_type = add_type(module, &saved_view_spec, "SavedView");
  return saved_view_type != nullptr;
}

bool is_saved_view(PyObject* object) { return Py_TYPE(object) == saved_view_type; }

SavedView* new_saved_view(at::Tensor save, c10::Device device) {
  return make_saved_view(saved_view_type, std::move(save), device);
}

}  // namespace torch_offload_pyext
