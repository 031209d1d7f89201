// Manager's window of saves kept on the device (ManagerConfig::keep_on_device_bytes): the newest
// saves stay where they are, and each is copied to host memory only when newer saves push it out
// of the window. A forward's last saves are backward's first restores: kept, they are served by
// their own memory, and the link never carries them. Every other path treats a kept entry as one
// whose bytes are not in host memory yet: nothing prefetches it, and a restore that needs its host
// bytes (another device, a view of its handle) copies it out first.
#include <ATen/ops/from_blob.h>
#include <c10/core/TensorImpl.h>

#include "manager.h"

namespace torch_offload {

void Manager::check_keep_on_device_bytes(int64_t bytes) const {
  TORCH_CHECK(bytes >= 0, "keep_on_device_bytes must be >= 0, got ", bytes);
  TORCH_CHECK(
      bytes == 0 || (!config_.synchronous && config_.disk_dir.empty()),
      "keep_on_device_bytes=", bytes,
      " is for asynchronous copies to host memory: it cannot be combined with ",
      config_.synchronous ? "synchronous=True (the \"sync\" mode)" : "disk_dir (the disk tier)");
}

void Manager::set_keep_on_device_bytes(int64_t bytes) {
  check_keep_on_device_bytes(bytes);
  finished_sources_.drop();
  std::lock_guard<std::mutex> lock(mutex_);
  keep_limit_ = bytes;
  while (window_bytes_ > bytes) evict_locked(entries_.at(window_.front()));
}

bool Manager::keeps_on_device(const at::Tensor& src, const DeviceTransfer* transfer) const {
  const auto nbytes = static_cast<int64_t>(src.nbytes());
  const int64_t limit = keep_limit_.load();
  return limit > 0 && transfer != nullptr && nbytes > 0 && nbytes <= limit;
}

void Manager::enter_window_locked(const void* key, Entry& entry) {
  window_.push_back(key);
  entry.window_pos = std::prev(window_.end());
  entry.in_window = true;
  window_bytes_ += static_cast<int64_t>(entry.kept_source.nbytes());
  while (window_bytes_ > keep_limit_.load()) evict_locked(entries_.at(window_.front()));
}

void Manager::leave_window_locked(Entry& entry) {
  window_.erase(entry.window_pos);
  entry.in_window = false;
  window_bytes_ -= static_cast<int64_t>(entry.kept_source.nbytes());
}

void Manager::evict_locked(Entry& entry) {
  if (entry.in_window) leave_window_locked(entry);
  const at::Tensor src = std::move(entry.kept_source);  // the copy's source slot holds it now
  const at::Tensor destination =
      at::from_blob(entry.stored->destination(), src.sizes(), src.options().device(c10::kCPU));
  const ToHostCopy copy = start_copy_to_host(src, destination, transfer_for(entry.source_device));
  entry.stored->commit(copy.done);
  set_copy_to_host(entry, copy);
  counters_.bytes_to_host += static_cast<int64_t>(src.nbytes());
}

at::Tensor Manager::restore_kept_locked(Entry& entry, c10::Device device,
                                        DeviceTransfer* transfer) {
  if (entry.in_window) leave_window_locked(entry);  // kept from now on until the handle dies
  const at::Tensor& kept = entry.kept_source;
  // A new tensor (no autograd history, its own version counter) on the kept memory, as a restored
  // copy would be.
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(kept.storage()),
                                                            kept.key_set(), kept.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(kept.sizes(), kept.strides(),
                                                   kept.storage_offset());
  entry.restored = true;
  counters_.restores++;
  counters_.restores_kept_on_device++;
  counters_.bytes_kept_on_device += static_cast<int64_t>(out.nbytes());
  // The entries saved before it come next in backward: start their copies now.
  prefetch_before_locked(entry, device, transfer);
  return out;
}

}  // namespace torch_offload
