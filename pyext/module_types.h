// Adding the extension's types to the module (save_hooks.cpp, saved_view.cpp,
// checkpoint_frame.cpp).
#pragma once

#include <Python.h>

namespace torch_offload_pyext {

// Adds a type made from `spec` to `module` as `name`; the type, borrowed (the module holds it), or
// nullptr with the Python error set.
inline PyTypeObject* add_type(PyObject* module, PyType_Spec* spec, const char* name) {
  PyObject* type = PyType_FromSpec(spec);
  if (type == nullptr || PyModule_AddObject(module, name, type) < 0) {
    Py_XDECREF(type);
    return nullptr;
  }
  return reinterpret_cast<PyTypeObject*>(type);
}

}  // namespace torch_offload_pyext
