#pragma once
// The window of saves kept on the device (ManagerConfig::keep_on_device_bytes). The newest saves
// stay where they are, and each is copied to host memory only when newer saves push it out of the
// window. Why: a forward's last saves are backward's first restores; kept, they are served by their
// own memory and the link never carries them.
//
// What it holds: the keys of the Manager's entries that are kept and still counted, oldest first,
// each with its bytes, and the window's size (the limit). Invariant: bytes() is the sum of the
// bytes of the keys in the window, and once a Manager operation returns it is at most limit() (the
// Manager copies out the oldest entries until it is: only it can start their copies).
//
// Locking: guarded by Manager::mutex_, under which every member is called, except limit() and
// keeps(): a save reads the limit before it takes the lock, so the limit is atomic (it is written
// under the lock, with the entries evicted for a smaller one).
#include <atomic>
#include <cstdint>
#include <list>
#include <utility>

#include "manager_config.h"

namespace torch_offload {

class DeviceWindow {
 public:
  // Where a key is in the window: valid until it leaves (list iterators stay valid).
  using Position = std::list<std::pair<const void*, int64_t>>::iterator;

  // Throws a clear error for a window size a manager with `config` cannot take.
  static void check_limit(int64_t bytes, const ManagerConfig& config);

  DeviceWindow() = default;  // limit 0: nothing kept
  DeviceWindow(const DeviceWindow&) = delete;
  DeviceWindow& operator=(const DeviceWindow&) = delete;

  int64_t limit() const { return limit_.load(); }
  void set_limit(int64_t bytes) { limit_ = bytes; }
  // Whether a save of `nbytes` (on a device with a transfer, `has_transfer`) is kept instead of
  // copied: it fits a window that is not empty.
  bool keeps(int64_t nbytes, bool has_transfer) const {
    const int64_t limit = limit_.load();
    return limit > 0 && has_transfer && nbytes > 0 && nbytes <= limit;
  }

  // Adds `key` as the newest entry of the window. The window may be over its limit afterwards.
  Position enter(const void* key, int64_t nbytes);
  // Takes the key at `pos` out (it is copied out, restored, or its handle died).
  void leave(Position pos);
  bool over_limit() const { return bytes_ > limit_.load(); }
  // The oldest key in the window: the next to be copied out (the window is not empty).
  const void* oldest() const { return keys_.front().first; }
  int64_t bytes() const { return bytes_; }

 private:
  std::list<std::pair<const void*, int64_t>> keys_;  // (key, bytes), oldest first
  int64_t bytes_ = 0;
  std::atomic<int64_t> limit_{0};
};

}  // namespace torch_offload
