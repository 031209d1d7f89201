// The engine's own host cost per save and per restore, without a GPU: the saves of a "modules"
// step (24 batches of 12 saves of 5 storages, as a selected Llama self_attn call makes) go through
// the save filter, the deduplicated saves and the manager's batches, and backward restores them
// newest first, through a transfer whose copies are plain memcpys that complete at once. Tensors
// are small, so what is timed is bookkeeping (the work a host-bound step pays on its main thread).
// Copies complete at once, so with a bound on copies in flight every batch also waits for the
// releaser thread to have released the one before (a wake-up each way): max_in_flight 0 (no bound)
// leaves the bookkeeping alone. On a 2-core CPU host: 1.8 ms per step with the bound of 4,
// 0.44-0.47 ms without (1.5-1.6 us per save); inside a real training step on a GPU host the
// engine's forward took ~4 ms per step, its caches cold between the model's ops
// (docs/performance.md).
//
//   build/benchmarks/cpp/engine_host_cost [steps] [max_in_flight]
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "csrc/backward_scope.h"
#include "csrc/manager.h"

namespace {

using torch_offload::CopyFence;
using torch_offload::FencePtr;

class DoneFence final : public CopyFence {
 public:
  bool query() override { return true; }
  void synchronize() override {}
};

// Copies at once on the calling thread; every fence is complete when returned.
class MemcpyTransfer final : public torch_offload::DeviceTransfer {
 public:
  FencePtr copy_to_host(const at::Tensor& src, const at::Tensor& dst) override {
    std::memcpy(dst.data_ptr(), src.const_data_ptr(), src.nbytes());
    return done_;
  }
  FencePtr copy_to_host_batch(const std::vector<std::pair<at::Tensor, at::Tensor>>& copies,
                              c10::Stream) override {
    for (const auto& [src, dst] : copies) {
      std::memcpy(dst.data_ptr(), src.const_data_ptr(), src.nbytes());
    }
    return done_;
  }
  std::pair<at::Tensor, FencePtr> copy_to_device(const at::Tensor& host, c10::Device,
                                                 const FencePtr&) override {
    at::Tensor out = at::empty(host.sizes(), host.options());
    std::memcpy(out.data_ptr(), host.const_data_ptr(), host.nbytes());
    return {out, done_};
  }
  void compute_waits_for(const FencePtr&, c10::Device) override {}
  double compute_wait_ms() override { return 0.0; }
  void reset_compute_wait() override {}

 private:
  const FencePtr done_ = std::make_shared<DoneFence>();
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  constexpr int kCalls = 24;
  constexpr int kWarmup = 10;  // steps run before the timed ones
  // One backward at a time, each its own task: the unpacks of a step share restores.
  int64_t task = 0;
  std::vector<std::function<void()>> at_end;
  torch_offload::set_default_backward_scope(
      {[&task] { return task; }, [&at_end](std::function<void()> f) { at_end.push_back(f); }});
  torch_offload::ManagerConfig config;
  config.max_in_flight = argc > 2 ? std::atoi(argv[2]) : 4;
  config.prefetch_depth = 8;
  auto manager = torch_offload::Manager::create(config, std::make_shared<MemcpyTransfer>());
  const int64_t filter_id = manager->save_filters().add(/*min_bytes=*/1024, /*record=*/true);
  const auto filter = manager->save_filters().get(filter_id);

  const at::Tensor weight = at::randn({32, 32}).requires_grad_(true);
  const at::Tensor cos = at::randn({64, 32}), sin = at::randn({64, 32});  // leaves without grad
  double forward_s = 0.0, backward_s = 0.0;
  int64_t saves = 0, unpacks = 0;
  for (int step = 0; step < steps + kWarmup; ++step) {
    const bool timed = step >= kWarmup;
    // A call's 5 activations, made outside the timed part: detached, so asked with not_a_weight
    // (as the hooks ask for a leaf without grad they checked), which the filter decides as it
    // decides an op's output.
    std::vector<std::vector<at::Tensor>> outputs(kCalls);
    for (auto& call : outputs) {
      for (int i = 0; i < 5; ++i) call.push_back((at::randn({64, 32}) * weight.sum()).detach());
    }
    std::vector<std::vector<at::Tensor>> saved(kCalls);
    for (int c = 0; c < kCalls; ++c) {
      auto& o = outputs[c];
      saved[c] = {o[0], o[0],     o[0], weight.t(), weight.t(), o[1],
                  o[2], o[2].t(), cos,  sin,        o[3],       o[4].view({32, 64})};
    }
    std::vector<std::vector<at::Tensor>> handles(kCalls);
    filter->reset_record();  // as modules mode does at each forward's start
    const auto forward_start = std::chrono::steady_clock::now();
    for (int c = 0; c < kCalls; ++c) {
      manager->begin_batch();
      for (const at::Tensor& t : saved[c]) {
        const auto decision = filter->decide(t, /*not_a_weight=*/true);
        handles[c].push_back(decision == torch_offload::SaveDecision::kOffload
                                 ? manager->saved_regions().pack(t)
                                 : at::Tensor());
      }
      manager->end_batch();
    }
    if (timed) forward_s += seconds_since(forward_start);
    saved.clear();
    outputs.clear();
    task++;
    const auto backward_start = std::chrono::steady_clock::now();
    for (int c = kCalls - 1; c >= 0; --c) {
      for (auto it = handles[c].rbegin(); it != handles[c].rend(); ++it) {
        if (!it->defined()) continue;
        at::Tensor restored = manager->saved_regions().unpack(*it, c10::Device(c10::kCPU));
        if (timed) unpacks++;
      }
      if (timed) saves += static_cast<int64_t>(handles[c].size());
      handles[c].clear();  // the call's saves die with its backward
    }
    for (auto& f : at_end) f();
    at_end.clear();
    if (timed) backward_s += seconds_since(backward_start);
  }
  manager->synchronize();
  std::printf(
      "steps %d, max_in_flight %lld: forward %.1f us per step (%.2f us per save), "
      "backward %.1f us per step (%.2f us per unpack)\n",
      steps, static_cast<long long>(config.max_in_flight), forward_s / steps * 1e6,
      forward_s / saves * 1e6, backward_s / steps * 1e6, backward_s / unpacks * 1e6);
  return 0;
}
