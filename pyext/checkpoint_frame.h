// torch_offload._save_hooks.CheckpointFrame: the saved-tensor hooks of one non-reentrant checkpoint
// call (torch_offload/nonreentrant.py), in C. See checkpoint_frame.cpp.
#pragma once

#include <Python.h>

namespace torch_offload_pyext {

// Adds CheckpointFrame and StopRecompute to `module`; false with the Python error set on failure.
bool add_checkpoint_frame(PyObject* module);

}  // namespace torch_offload_pyext
