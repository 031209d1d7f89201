#pragma once
// OffloadManager: the user-facing handle on one offload engine, registered as
// torch.classes.offload.OffloadManager. Usable from Python, TorchScript (as a module attribute,
// saved and loaded through def_pickle) and C++. Ops take its id(), never the object itself.
#include <torch/custom_class.h>

#include <memory>
#include <string>
#include <vector>

#include "csrc/manager.h"

namespace torch_offload {

class OffloadManager : public torch::CustomClassHolder {
 public:
  OffloadManager(int64_t max_in_flight, int64_t prefetch_depth, int64_t host_budget_bytes,
                 bool synchronous = false);

  int64_t id() const { return manager_->id(); }
  c10::Dict<std::string, double> stats() const;
  void reset_stats() { manager_->reset_stats(); }
  void synchronize() { manager_->synchronize(); }
  void empty_pool() { manager_->empty_pool(); }
  int64_t max_in_flight() const { return manager_->config().max_in_flight; }
  int64_t prefetch_depth() const { return manager_->config().prefetch_depth; }
  int64_t host_budget_bytes() const { return manager_->config().host_budget_bytes; }
  bool synchronous() const { return manager_->config().synchronous; }

  // Configuration only: a loaded manager starts with an empty pool and fresh statistics.
  std::vector<int64_t> state() const;
  static c10::intrusive_ptr<OffloadManager> from_state(const std::vector<int64_t>& state);

 private:
  std::shared_ptr<Manager> manager_;
};

}  // namespace torch_offload
