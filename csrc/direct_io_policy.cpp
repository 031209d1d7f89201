#include "direct_io_policy.h"

#include <fstream>
#include <string>

namespace torch_offload {

bool DirectIoPolicy::choose(int64_t bytes) {
  if (mode_ != DirectIo::kWhenRamIsShort) return mode_ == DirectIo::kAlways;
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t available =
      simulated_available_ >= 0 ? simulated_available_ : available_ram_bytes();
  // MemAvailable already counts our cached files as reclaimable, so they are counted twice here:
  // the rule errs towards direct IO when RAM is tight. Unknown RAM: the page cache, as before.
  const bool direct = available >= 0 && available < cached_bytes_ + bytes + kHeadroomBytes;
  if (!direct) cached_bytes_ += bytes;
  return direct;
}

void DirectIoPolicy::file_closed(int64_t bytes, bool direct) {
  if (mode_ != DirectIo::kWhenRamIsShort || direct) return;
  std::lock_guard<std::mutex> lock(mutex_);
  cached_bytes_ -= bytes;
}

void DirectIoPolicy::simulate_available_ram(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  simulated_available_ = bytes;
}

int64_t available_ram_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

}  // namespace torch_offload
