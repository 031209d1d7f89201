#include "offload_kernels.h"

#include "csrc/manager.h"
#include "csrc/manager_registry.h"

namespace torch_offload::ops {

at::Tensor offload_save(const at::Tensor& x, int64_t manager) {
  return find_manager(manager)->save(x);
}

at::Tensor offload_restore(const at::Tensor& handle, c10::Device device, int64_t manager) {
  return find_manager(manager)->restore(handle, device);
}

}  // namespace torch_offload::ops
