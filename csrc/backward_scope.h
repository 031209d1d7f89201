#pragma once
// What the autograd engine tells about the backward running on this thread. The deduplicated saves
// (saved_regions.h) share one restore among the unpacks of one backward and drop it when that
// backward ends; the engine that knows which backward runs is torch's, which only the ops layer
// links against, so it hands its scope over here when the library loads (ops/
// saved_region_kernels.cpp). Tests and benchmarks set fakes.
#include <cstdint>
#include <functional>

namespace torch_offload {

struct BackwardScope {
  // The id of the backward running on this thread, -1 outside any.
  std::function<int64_t()> current_task;
  // Runs `callback` when the current backward ends (called only inside one).
  std::function<void(std::function<void()>)> at_end;
};

// The scope each new manager's SavedRegions takes. Until the ops layer sets the engine's own,
// every backward is "none" (-1): every unpack restores its copy, nothing is shared. Thread-safe.
void set_default_backward_scope(BackwardScope scope);
BackwardScope default_backward_scope();

}  // namespace torch_offload
