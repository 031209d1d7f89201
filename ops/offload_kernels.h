#pragma once
// Kernel bodies shared by the per-dispatch-key registrations: they resolve the manager id and
// hand the work to the engine in csrc/.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace torch_offload::ops {

at::Tensor offload_save(const at::Tensor& x, int64_t manager);
at::Tensor offload_restore(const at::Tensor& handle, c10::Device device, int64_t manager);

}  // namespace torch_offload::ops
