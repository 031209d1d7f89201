// Kernels of offload_pack / offload_unpack (the save hooks' deduplicated saves,
// csrc/saved_regions.h). Registered as CompositeImplicitAutograd: they run above autograd, where
// the saved tensor's view base is visible, and call no differentiable op (the guard keeps the
// engine's own view and copy ops out of autograd), so their outputs carry no autograd history.
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include "csrc/manager.h"
#include "csrc/manager_registry.h"

namespace {

at::Tensor offload_pack(const at::Tensor& t, int64_t manager) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return torch_offload::find_manager(manager)->saved_regions().pack(t);
}

at::Tensor offload_unpack(const at::Tensor& save, c10::Device device, int64_t manager) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return torch_offload::find_manager(manager)->saved_regions().unpack(save, device);
}

// The autograd engine's running backward, so that the unpacks of one backward share a restore.
const bool backward_scope_set = [] {
  torch_offload::set_default_backward_scope(
      {[] { return static_cast<int64_t>(torch::autograd::get_current_graph_task_id()); },
       [](std::function<void()> callback) {
         torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
       }});
  return true;
}();

}  // namespace

TORCH_LIBRARY_IMPL(offload, CompositeImplicitAutograd, m) {
  m.impl("offload_pack", &offload_pack);
  m.impl("offload_unpack", &offload_unpack);
}
