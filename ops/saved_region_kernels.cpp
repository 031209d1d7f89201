// Kernels of offload_pack / offload_pack_filtered / offload_unpack (the save hooks' deduplicated
// saves, csrc/saved_regions.h, and their filter, csrc/save_filter.h) and offload_batch (their
// copies issued together, Manager::begin_batch). Registered as
// CompositeImplicitAutograd: they run above autograd, where the saved tensor's view base is
// visible, and call no differentiable op (the guard keeps the engine's own view and copy ops out of
// autograd), so their outputs carry no autograd history.
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <tuple>

#include "csrc/backward_scope.h"
#include "csrc/manager.h"
#include "csrc/manager_registry.h"

namespace {

at::Tensor offload_pack(const at::Tensor& t, int64_t manager) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return torch_offload::find_manager(manager)->saved_regions().pack(t);
}

// The save hooks' pack for a plain tensor: the filter decides (save_filter.h), and an offloaded
// tensor is packed as by offload_pack. The save handle is undefined (None in Python) unless the
// decision is SaveDecision::kOffload; the decision is returned as its code (save_decision.h).
std::tuple<at::Tensor, int64_t> offload_pack_filtered(const at::Tensor& t, int64_t manager,
                                                      int64_t filter, bool not_a_weight) {
  at::AutoDispatchBelowADInplaceOrView guard;
  const auto found = torch_offload::find_manager(manager);
  const auto decision = found->save_filters().get(filter)->decide(t, not_a_weight);
  const auto code = static_cast<int64_t>(decision);
  if (decision != torch_offload::SaveDecision::kOffload) return {at::Tensor(), code};
  return {found->saved_regions().pack(t), code};
}

at::Tensor offload_unpack(const at::Tensor& save, c10::Device device, int64_t manager) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return torch_offload::find_manager(manager)->saved_regions().unpack(save, device);
}

void offload_batch(int64_t manager, bool begin) {
  const auto found = torch_offload::find_manager(manager);
  if (begin) {
    found->begin_batch();
  } else {
    found->end_batch();
  }
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
  m.impl("offload_pack_filtered", &offload_pack_filtered);
  m.impl("offload_unpack", &offload_unpack);
  m.impl("offload_batch", &offload_batch);
}
