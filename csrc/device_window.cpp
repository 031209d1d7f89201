#include "device_window.h"

#include <c10/util/Exception.h>

#include <iterator>

namespace torch_offload {

void DeviceWindow::check_limit(int64_t bytes, const ManagerConfig& config) {
  TORCH_CHECK(bytes >= 0, "keep_on_device_bytes must be >= 0, got ", bytes);
  TORCH_CHECK(
      bytes == 0 || (!config.synchronous && config.disk_dir.empty()),
      "keep_on_device_bytes=", bytes,
      " is for asynchronous copies to host memory: it cannot be combined with ",
      config.synchronous ? "synchronous=True (the \"sync\" mode)" : "disk_dir (the disk tier)");
}

DeviceWindow::Position DeviceWindow::enter(const void* key, int64_t nbytes) {
  keys_.emplace_back(key, nbytes);
  bytes_ += nbytes;
  return std::prev(keys_.end());
}

void DeviceWindow::leave(Position pos) {
  bytes_ -= pos->second;
  keys_.erase(pos);
}

}  // namespace torch_offload
