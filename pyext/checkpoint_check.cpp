// The determinism check of the non-reentrant checkpoint's frames: see checkpoint_check.h.
#include "pyext/checkpoint_check.h"

#include <sstream>

namespace torch_offload_pyext {

const char kCheckpointDebugTip[] =
    "\nTip: To see a more detailed error message, pass `debug=True` to "
    "torch_offload.checkpoint(...) (torch's checkpoint path, with its operator traces).";

namespace {

// What a different number of saved tensors most often means, added to torch's wording.
const char kDifferentCountCause[] =
    "Likely cause: a KV cache (config.use_cache) or other state that changes between the forward "
    "and the recompute (a counter, a cache filled on the first call), so the recompute runs other "
    "code than the forward did.";

}  // namespace

PyObject* raise_checkpoint_error(const std::string& message) {
  static PyObject* error_type = nullptr;
  if (error_type == nullptr) {
    PyObject* module = PyImport_ImportModule("torch.utils.checkpoint");
    if (module == nullptr) return nullptr;
    error_type = PyObject_GetAttrString(module, "CheckpointError");
    Py_DECREF(module);
    if (error_type == nullptr) return nullptr;
  }
  PyErr_SetString(error_type, message.c_str());
  return nullptr;
}

namespace {

std::string describe(const SavedMetadata& m) {
  std::ostringstream out;
  out << "{'shape': torch.Size([";
  for (size_t i = 0; i < m.sizes.size(); ++i) out << (i ? ", " : "") << m.sizes[i];
  out << "]), 'dtype': " << m.dtype << ", 'device': " << m.device << "}";
  return out.str();
}

}  // namespace

bool recompute_matches(const std::vector<SavedMetadata>& forward, size_t saved, bool check_metadata,
                       const std::vector<at::Tensor>& recomputed) {
  if (recomputed.size() != saved) {
    std::ostringstream message;
    message << "torch_offload.checkpoint: A different number of tensors was saved during the "
               "original forward and recomputation.\nNumber of tensors saved during forward: "
            << saved << "\nNumber of tensors saved during recomputation: " << recomputed.size()
            << ".\n"
            << kDifferentCountCause << kCheckpointDebugTip;
    raise_checkpoint_error(message.str());
    return false;
  }
  if (!check_metadata) return true;
  std::ostringstream mismatched;
  for (size_t i = 0; i < saved; ++i) {
    const SavedMetadata now = SavedMetadata::of(recomputed[i]);
    const SavedMetadata& then = forward[i];
    if (now.sizes != then.sizes || now.dtype != then.dtype || now.device != then.device) {
      mismatched << "tensor at position " << i << ":\nsaved metadata: " << describe(then)
                 << "\nrecomputed metadata: " << describe(now) << "\n";
    }
  }
  if (mismatched.tellp() == 0) return true;
  raise_checkpoint_error(
      "torch_offload.checkpoint: Recomputed values for the following tensors have different "
      "metadata than during the forward pass.\n" +
      mismatched.str() + ".\n" + kCheckpointDebugTip);
  return false;
}

}  // namespace torch_offload_pyext
