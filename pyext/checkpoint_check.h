// The determinism check of the non-reentrant checkpoint's frames (checkpoint_frame.cpp): what the
// forward saved against what the recompute saved, with torch's CheckpointError and wording.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>

#include <string>
#include <vector>

namespace torch_offload_pyext {

// What the check compares of one saved tensor (torch's default metadata: shape, dtype, device).
struct SavedMetadata {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  c10::Device device;

  static SavedMetadata of(const at::Tensor& tensor) {
    return {tensor.sizes().vec(), tensor.scalar_type(), tensor.device()};
  }
};

// The hint every CheckpointError of ours ends with.
extern const char kCheckpointDebugTip[];

// Sets torch.utils.checkpoint.CheckpointError(message); returns nullptr.
PyObject* raise_checkpoint_error(const std::string& message);

// torch's check_recomputed_tensors_match: false, with the error set, when the recompute saved a
// different number of tensors than the forward (`saved`), or, with `check_metadata`, any of another
// shape, dtype or device than `forward` records.
bool recompute_matches(const std::vector<SavedMetadata>& forward, size_t saved, bool check_metadata,
                       const std::vector<at::Tensor>& recomputed);

}  // namespace torch_offload_pyext
