#include "offload_manager.h"

namespace torch_offload {

OffloadManager::OffloadManager(int64_t max_in_flight, int64_t prefetch_depth,
                               int64_t host_budget_bytes, bool synchronous)
    : manager_(Manager::create(
          ManagerConfig{max_in_flight, prefetch_depth, host_budget_bytes, synchronous})) {}

c10::Dict<std::string, double> OffloadManager::stats() const {
  c10::Dict<std::string, double> out;
  for (const auto& [name, value] : manager_->stats().items()) out.insert(name, value);
  return out;
}

std::vector<int64_t> OffloadManager::state() const {
  return {max_in_flight(), prefetch_depth(), host_budget_bytes(), synchronous() ? 1 : 0};
}

c10::intrusive_ptr<OffloadManager> OffloadManager::from_state(const std::vector<int64_t>& state) {
  TORCH_CHECK(state.size() == 4, "OffloadManager: bad pickled state of size ", state.size());
  return c10::make_intrusive<OffloadManager>(state[0], state[1], state[2], state[3] != 0);
}

}  // namespace torch_offload
