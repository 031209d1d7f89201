#pragma once
// Which of the disk tier's files bypass the page cache (O_DIRECT). kNever and kAlways are the
// user's choice. kWhenRamIsShort decides per file: while the host's RAM can hold every file kept
// through the page cache, the page cache serves backward's reads at memory speed (on a host with
// 125 GB of RAM: 0.98-0.99x checkpointing's speed through the disk, against 0.41-0.54x with direct
// IO at the disk's 2.4 GB/s; docs/performance.md); once it cannot, it only adds a copy of each
// byte and pushes other data out, and the file goes around it.
#include <cstdint>
#include <mutex>

namespace torch_offload {

enum class DirectIo { kNever, kAlways, kWhenRamIsShort };

class DirectIoPolicy {
 public:
  // RAM kWhenRamIsShort leaves to everything else on the host.
  static constexpr int64_t kHeadroomBytes = int64_t{1} << 30;

  explicit DirectIoPolicy(DirectIo mode) : mode_(mode) {}
  DirectIo mode() const { return mode_; }
  // Whether a new file of `bytes` goes around the page cache. A file that does not counts as
  // held by the page cache until file_closed().
  bool choose(int64_t bytes);
  void file_closed(int64_t bytes, bool direct);
  // Test hook: the available RAM kWhenRamIsShort sees (-1: the host's, from /proc/meminfo).
  void simulate_available_ram(int64_t bytes);

 private:
  const DirectIo mode_;
  std::mutex mutex_;
  int64_t cached_bytes_ = 0;  // live files written through the page cache
  int64_t simulated_available_ = -1;
};

// MemAvailable of /proc/meminfo in bytes (RAM that can be had without swapping, the page cache's
// reclaimable part included); -1 where it cannot be read.
int64_t available_ram_bytes();

}  // namespace torch_offload
