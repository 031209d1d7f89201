#include "op_calls.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace torch_offload::ops {

at::Tensor call_offload_save(const at::Tensor& x, int64_t manager) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("offload::offload_save", "")
                       .typed<at::Tensor(const at::Tensor&, int64_t)>();
  return op.call(x, manager);
}

at::Tensor call_offload_restore(const at::Tensor& handle, c10::Device device, int64_t manager) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("offload::offload_restore", "")
                       .typed<at::Tensor(const at::Tensor&, c10::Device, int64_t)>();
  return op.call(handle, device, manager);
}

}  // namespace torch_offload::ops
