// The Manager's window of saves kept on the device (manager.h; its state is a DeviceWindow,
// device_window.h): entering it, copying out its oldest entries, and restores it serves.
#include <ATen/ops/from_blob.h>
#include <c10/core/TensorImpl.h>

#include "manager.h"

namespace torch_offload {

// The window of saves kept on the device (device_window.h). A kept entry has its source in
// kept_source and no copy started; evict_locked starts the copy, after which it is like any other.
void Manager::set_keep_on_device_bytes(int64_t bytes) {
  DeviceWindow::check_limit(bytes, config_);
  finished_sources_.drop();
  std::lock_guard<std::mutex> lock(mutex_);
  window_.set_limit(bytes);
  shrink_window_locked();
}

void Manager::enter_window_locked(const void* key, Entry& entry) {
  entry.window_pos = window_.enter(key, static_cast<int64_t>(entry.kept_source.nbytes()));
  entry.in_window = true;
  shrink_window_locked();
}

void Manager::shrink_window_locked() {
  while (window_.over_limit()) evict_locked(entries_.at(window_.oldest()));
}

void Manager::leave_window_locked(Entry& entry) {
  window_.leave(entry.window_pos);
  entry.in_window = false;
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
