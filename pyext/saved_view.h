// torch_offload._save_hooks.SavedView: what autograd keeps for one save the C hooks took. See
// saved_view.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace torch_offload_pyext {

// One save: its save handle once offloaded (a host tensor), the device to restore to, and a
// DTensor's spec when the save is its local shard (set from Python). A save of a selected module
// call (offload_activations' batch_copies) is first only held (`held`, the saved tensor, and its
// version when saved) and offloaded when the call ends, together with the call's other saves
// (save_hooks.cpp, "deferred saves"); a held save the engine keeps on the device stays held.
// The tensors are C++ values: the pack hook makes no Python object for them (a Python tensor per
// save handle was one more object for the garbage collector per save; a modules step crossed its
// threshold with them), and Python reads them through getters. Not tracked by the garbage
// collector (hundreds are made per step): nothing in it can lead back to it (the handle has no
// autograd history; `held` is what autograd itself would hold).
struct SavedView {
  PyObject ob_base;  // PyObject_HEAD
  at::Tensor save;   // constructed in place by make_saved_view, destroyed in its dealloc
  c10::Device device;
  PyObject* dtensor_spec;
  at::Tensor held;
  int64_t held_version;
  bool pending;       // held until its call's batch ends
  bool not_a_weight;  // a held leaf without grad the hook checked is no frozen parameter
};

// Adds SavedView to `module`; false with the Python error set on failure.
bool add_saved_view(PyObject* module);
bool is_saved_view(PyObject* object);
// A SavedView holding `save` (may be undefined) for `device`; nullptr with the error set.
SavedView* new_saved_view(at::Tensor save, c10::Device device);

}  // namespace torch_offload_pyext
