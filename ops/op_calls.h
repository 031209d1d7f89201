#pragma once
// Calls of the registered ops through the dispatcher, for C++ code above the kernels (autograd
// kernels, the libtorch checkpoint API): they reach whichever kernel the inputs dispatch to.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace torch_offload::ops {

at::Tensor call_offload_save(const at::Tensor& x, int64_t manager);
at::Tensor call_offload_restore(const at::Tensor& handle, c10::Device device, int64_t manager);

}  // namespace torch_offload::ops
