// Autograd kernels. Both ops are copies between a device and the host, so their gradients are
// copies back. Registered in C++ so that TorchScript run from C++ and libtorch programs have them.
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops/op_calls.h"

namespace {

namespace ops = torch_offload::ops;

class OffloadSaveFunction : public torch::autograd::Function<OffloadSaveFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t manager) {
    ctx->saved_data["device"] = x.device();
    at::AutoDispatchBelowADInplaceOrView guard;
    return ops::call_offload_save(x, manager);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0].to(ctx->saved_data["device"].toDevice()), at::Tensor()};
  }
};

class OffloadRestoreFunction : public torch::autograd::Function<OffloadRestoreFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& handle,
                            c10::Device device, int64_t manager) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return ops::call_offload_restore(handle, device, manager);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0].to(c10::kCPU), at::Tensor(), at::Tensor()};
  }
};

at::Tensor offload_save_autograd(const at::Tensor& x, int64_t manager) {
  return OffloadSaveFunction::apply(x, manager);
}

at::Tensor offload_restore_autograd(const at::Tensor& handle, c10::Device device, int64_t manager) {
  return OffloadRestoreFunction::apply(handle, device, manager);
}

}  // namespace

TORCH_LIBRARY_IMPL(offload, Autograd, m) {
  m.impl("offload_save", &offload_save_autograd);
  m.impl("offload_restore", &offload_restore_autograd);
}
