#pragma once
// libtorch C++ API: gradient checkpointing with the input offloaded, for C++ modules.
//
//   auto manager = c10::make_intrusive<torch_offload::OffloadManager>(4, 1, 0);
//   x = torch_offload::checkpoint([&](const at::Tensor& h) { return block->forward(h); }, x,
//   manager);
//
// Forward runs `fn` without keeping its activations and sends `input` to host memory through
// offload_save; backward restores it (prefetched) through offload_restore, recomputes `fn` with the
// RNG state of the forward (dropout masks repeat), and backpropagates into the parameters `fn`
// uses.
#include <ATen/core/Tensor.h>

#include <functional>

#include "offload_manager.h"

namespace torch_offload {

using CheckpointFn = std::function<at::Tensor(const at::Tensor&)>;

at::Tensor checkpoint(CheckpointFn fn, const at::Tensor& input,
                      const c10::intrusive_ptr<OffloadManager>& manager);

}  // namespace torch_offload
