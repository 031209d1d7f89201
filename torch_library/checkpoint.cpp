#include "checkpoint.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/autograd.h>

#include <mutex>

#include "ops/op_calls.h"

namespace torch_offload {
namespace {

struct FunctionHolder : torch::CustomClassHolder {
  explicit FunctionHolder(CheckpointFn f) : fn(std::move(f)) {}
  CheckpointFn fn;
};

at::Generator generator_for(c10::Device device) {
  return at::globalContext().defaultGenerator(device.is_cpu() ? c10::Device(c10::kCPU) : device);
}

at::Tensor rng_state(c10::Device device) {
  at::Generator gen = generator_for(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(c10::Device device, const at::Tensor& state) {
  at::Generator gen = generator_for(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Restores the forward's RNG state for the recompute and puts the current one back afterwards.
class ReplayRng {
 public:
  ReplayRng(c10::Device device, const at::Tensor& cpu_state, const at::Tensor& device_state)
      : device_(device), cpu_now_(rng_state(c10::kCPU)) {
    set_rng_state(c10::kCPU, cpu_state);
    if (!device_.is_cpu()) {
      device_now_ = rng_state(device_);
      set_rng_state(device_, device_state);
    }
  }
  ~ReplayRng() {
    set_rng_state(c10::kCPU, cpu_now_);
    if (!device_.is_cpu()) set_rng_state(device_, device_now_);
  }

 private:
  c10::Device device_;
  at::Tensor cpu_now_;
  at::Tensor device_now_;
};

class OffloadCheckpointFunction : public torch::autograd::Function<OffloadCheckpointFunction> {
 public:
  // `anchor` requires grad when `input` does not, so that backward still runs and the parameters
  // used by the function get their gradients.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const c10::intrusive_ptr<FunctionHolder>& holder, int64_t manager,
                            const at::Tensor& anchor) {
    (void)anchor;
    ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
    ctx->saved_data["manager"] = manager;
    ctx->saved_data["device"] = input.device();
    ctx->saved_data["requires_grad"] = input.requires_grad();
    ctx->saved_data["cpu_rng"] = rng_state(c10::kCPU);
    if (!input.device().is_cpu()) ctx->saved_data["device_rng"] = rng_state(input.device());
    ctx->save_for_backward({ops::call_offload_save(input.detach(), manager)});
    return holder->fn(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const c10::Device device = ctx->saved_data["device"].toDevice();
    const bool requires_grad = ctx->saved_data["requires_grad"].toBool();
    auto holder =
        c10::static_intrusive_pointer_cast<FunctionHolder>(ctx->saved_data["fn"].toCapsule());
    at::Tensor input = ops::call_offload_restore(ctx->get_saved_variables()[0], device,
                                                 ctx->saved_data["manager"].toInt())
                           .detach()
                           .requires_grad_(requires_grad);
    at::Tensor output;
    {
      const at::Tensor device_rng =
          device.is_cpu() ? at::Tensor() : ctx->saved_data["device_rng"].toTensor();
      ReplayRng replay(device, ctx->saved_data["cpu_rng"].toTensor(), device_rng);
      at::AutoGradMode enable_grad(true);
      output = holder->fn(input);
    }
    if (output.requires_grad() && grads[0].defined()) {
      torch::autograd::backward({output}, {grads[0]});
    }
    return {requires_grad ? input.grad() : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpoint(CheckpointFn fn, const at::Tensor& input,
                      const c10::intrusive_ptr<OffloadManager>& manager) {
  if (!at::GradMode::is_enabled()) return fn(input);
  static const at::Tensor requires_grad_anchor = at::empty({0}).requires_grad_(true);
  static const at::Tensor plain_anchor = at::empty({0});
  const at::Tensor& anchor = input.requires_grad() ? plain_anchor : requires_grad_anchor;
  return OffloadCheckpointFunction::apply(input, c10::make_intrusive<FunctionHolder>(std::move(fn)),
                                          manager->id(), anchor);
}

}  // namespace torch_offload
