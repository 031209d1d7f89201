#include "fault_injection.h"

#include <atomic>
#include <mutex>

namespace torch_offload {
namespace {

struct Armed {
  int64_t skip = 0;
  int64_t times = 0;
};

std::atomic<bool> any_armed{false};
std::mutex mutex;
Armed armed[static_cast<int>(FaultSite::kCount)];

}  // namespace

void inject_fault(FaultSite site, int64_t skip, int64_t times) {
  std::lock_guard<std::mutex> lock(mutex);
  armed[static_cast<int>(site)] = Armed{skip, times};
  any_armed = true;
}

void clear_injected_faults() {
  std::lock_guard<std::mutex> lock(mutex);
  for (Armed& a : armed) a = Armed{};
  any_armed = false;
}

bool fault_injected(FaultSite site) {
  if (!any_armed.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(mutex);
  Armed& a = armed[static_cast<int>(site)];
  if (a.times <= 0) return false;
  if (a.skip > 0) {
    a.skip--;
    return false;
  }
  a.times--;
  return true;
}

}  // namespace torch_offload
