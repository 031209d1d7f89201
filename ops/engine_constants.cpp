// Kernels of stat_names, manager_defaults and save_decisions: what the engine declares once
// (csrc/offload_stats.h, csrc/manager_config.h, csrc/save_decision.h), for the Python package to
// read instead of writing it again. They take no tensor: registered as CompositeExplicitAutograd,
// the kernel every dispatch key falls back to, tensorless calls included.
#include <torch/library.h>

#include <string>
#include <vector>

#include "csrc/manager_config.h"
#include "csrc/offload_stats.h"
#include "csrc/save_decision.h"

namespace {

std::vector<std::string> stat_names() {
  const auto& names = torch_offload::OffloadStats::names;
  return {names.begin(), names.end()};
}

// The integer options of OffloadManager, with the values a ManagerConfig starts with.
c10::Dict<std::string, int64_t> manager_defaults() {
  const torch_offload::ManagerConfig defaults;
  c10::Dict<std::string, int64_t> out;
  out.insert("max_in_flight", defaults.max_in_flight);
  out.insert("prefetch_depth", defaults.prefetch_depth);
  out.insert("host_budget_bytes", defaults.host_budget_bytes);
  out.insert("keep_on_device_bytes", defaults.keep_on_device_bytes);
  out.insert("disk_io_threads", defaults.disk_io_threads);
  return out;
}

c10::Dict<std::string, int64_t> save_decisions() {
  c10::Dict<std::string, int64_t> out;
  for (const auto& [name, decision] : torch_offload::kSaveDecisionNames) {
    out.insert(name, static_cast<int64_t>(decision));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(offload, CompositeExplicitAutograd, m) {
  m.impl("stat_names", &stat_names);
  m.impl("manager_defaults", &manager_defaults);
  m.impl("save_decisions", &save_decisions);
}
