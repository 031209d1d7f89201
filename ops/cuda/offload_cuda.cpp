// CUDA kernel of offload_save: the device-to-host copy runs on the manager's side stream.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/offload_kernels.h"

namespace {

at::Tensor offload_save_cuda(const at::Tensor& x, int64_t manager) {
  const c10::cuda::CUDAGuard guard(x.device());
  return torch_offload::ops::offload_save(x, manager);
}

}  // namespace

TORCH_LIBRARY_IMPL(offload, CUDA, m) { m.impl("offload_save", &offload_save_cuda); }
