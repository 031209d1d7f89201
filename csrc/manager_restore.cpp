// The Manager's restore side (manager.h): finding a handle's entry, restoring it (from its kept
// source, a device prefetch or its tier), and prefetching what backward needs next.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <list>
#include <memory>
#include <tuple>
#include <utility>

#include "manager.h"
#include "version_check.h"

namespace torch_offload {

Manager::Entry* Manager::find_entry_locked(const at::Tensor& handle, const char* op) {
  if (!handle.has_storage()) return nullptr;
  const c10::DataPtr& data = handle.storage().data_ptr();
  if (data.get_deleter() != &free_handle) return nullptr;  // no manager saved it
  const auto* context = static_cast<const HandleContext*>(data.get_context());
  TORCH_CHECK(context->manager.get() == this, op, ": the tensor is a handle of OffloadManager id ",
              context->manager->id(), ", not of id ", id_,
              ": pass the id of the manager that saved it");
  auto it = entries_.find(context);
  if (it == entries_.end()) return nullptr;  // a handle whose save is still being set up
  Entry& entry = it->second;
  const bool exact = handle.storage_offset() == 0 && handle.sizes() == entry.sizes &&
                     handle.strides() == entry.strides && handle.scalar_type() == entry.dtype;
  // A view of a host-tier handle has the handle's bytes and is restored as a plain copy.
  TORCH_CHECK(exact || entry.stored->views_restore_as_copies(), op,
              ": the tensor is a view of a disk-tier handle (a slice, a transpose, a reshape): "
              "pass the handle offload_save returned, unchanged");
  return exact ? &entry : nullptr;
}

at::Tensor Manager::restore(const at::Tensor& handle, c10::Device device) {
  TORCH_CHECK(handle.defined() && handle.is_cpu(),
              "offload_restore: the handle must be the CPU tensor returned by offload_save");
  finished_sources_.drop();
  device = target_device(device, "offload_restore");
  DeviceTransfer* transfer = transfer_for(device);
  std::unique_lock<std::mutex> lock(mutex_);
  issue_batch_locked();  // a pending copy (of this entry or the ones prefetched next) has no fence
  Entry* found = find_entry_locked(handle, "offload_restore");
  if (found == nullptr) {
    // A view of a host-tier handle (its transpose, a slice), a copy of one, or any host tensor:
    // restoring it is a plain copy to `device`, once a handle's own copy has landed in host memory.
    FencePtr landed;
    const c10::DataPtr& data = handle.storage().data_ptr();
    if (data.get_deleter() == &free_handle) {
      auto it = entries_.find(data.get_context());
      if (it != entries_.end()) {
        if (it->second.kept_source.defined()) evict_locked(it->second);  // its bytes, to host
        landed = it->second.to_host_done;
      }
    }
    counters_.restores++;
    counters_.bytes_to_device += static_cast<int64_t>(handle.nbytes());
    lock.unlock();
    if (landed) landed->synchronize();
    return handle.to(device, /*non_blocking=*/false, /*copy=*/true);
  }
  // The entry stays in place while we hold its handle (the map never moves its elements).
  Entry& entry = *found;
  check_unmodified(entry);
  if (entry.kept_source.defined()) {
    if (entry.kept_source.device() == device) return restore_kept_locked(entry, device, transfer);
    evict_locked(entry);  // wanted on another device: through host memory like the others
  }
  at::Tensor out;
  if (entry.prefetched.defined() && entry.prefetched.device() == device) {
    out = std::move(entry.prefetched);
    entry.prefetched = at::Tensor();
    transfer->compute_waits_for(entry.prefetch_done, device);
    counters_.prefetch_hits++;
  } else {
    HostBytes bytes;
    if (entry.stored->resident() != nullptr) {
      bytes = entry.stored->bytes_for_restore();  // in host memory: no wait
    } else {
      // The tier waits for IO: without the lock, so other handles go on meanwhile. A read-ahead
      // finishing meanwhile may let a device prefetch of this entry start: this copy serves, and
      // the prefetched tensor goes once its copy, which still writes it, has finished.
      const std::shared_ptr<StoredTensor> stored = entry.stored;
      lock.unlock();
      bytes = stored->bytes_for_restore();
      lock.lock();
      if (entry.prefetched.defined()) {
        const FencePtr done = entry.prefetch_done;
        releaser_.release_after(
            [done] { done->synchronize(); },
            [unused = std::move(entry.prefetched)]() mutable { unused = at::Tensor(); },
            /*copies_in_flight=*/0);
        entry.prefetched = at::Tensor();
      }
    }
    if (bytes.read_ahead) counters_.prefetch_hits++;
    try {
      out = copy_for_restore_locked(entry, bytes.data, device, transfer);
    } catch (...) {
      if (bytes.release) bytes.release();
      throw;
    }
    if (bytes.release) {
      // The buffer goes back to its tier once the device copy has read it.
      const FencePtr fence = transfer != nullptr ? entry.last_fence : nullptr;
      if (fence && !fence->query()) {
        releaser_.release_after([fence] { fence->synchronize(); }, std::move(bytes.release),
                                /*copies_in_flight=*/0);
      } else {
        bytes.release();
      }
    }
  }
  finish_restore_locked(entry, out, device, transfer);
  return out;
}

at::Tensor Manager::copy_for_restore_locked(Entry& entry, const void* host_data, c10::Device device,
                                            DeviceTransfer* transfer) {
  const at::Tensor host = host_tensor(entry, host_data);
  if (transfer != nullptr) {
    auto [out, done] = transfer->copy_to_device(host, device, entry.to_host_done);
    entry.last_fence = done;
    transfer->compute_waits_for(done, device);
    return out;
  }
  if (entry.to_host_done) entry.to_host_done->synchronize();  // source was on a device
  at::Tensor out = at::empty(host.sizes(), host.options());
  out.copy_(host);
  return out;
}

void Manager::finish_restore_locked(Entry& entry, const at::Tensor& out, c10::Device device,
                                    DeviceTransfer* transfer) {
  entry.restored = true;
  counters_.restores++;
  counters_.bytes_to_device += static_cast<int64_t>(out.nbytes());
  if (!config_.synchronous) prefetch_before_locked(entry, device, transfer);
}

void Manager::prefetch(const at::Tensor& handle, c10::Device device) {
  TORCH_CHECK(handle.defined() && handle.is_cpu(),
              "prefetch: the handle must be the CPU tensor returned by offload_save");
  device = target_device(device, "prefetch");
  DeviceTransfer* transfer = transfer_for(device);
  std::lock_guard<std::mutex> lock(mutex_);
  issue_batch_locked();
  Entry* found = find_entry_locked(handle, "prefetch");
  TORCH_CHECK(
      found != nullptr,
      "prefetch: the tensor is not a live handle of this manager (offload_save returns one)");
  Entry& entry = *found;
  const void* bytes = entry.stored->resident();
  if (config_.synchronous || transfer == nullptr || bytes == nullptr ||
      entry.prefetched.defined() || entry.kept_source.defined()) {
    return;
  }
  check_unmodified(entry);
  start_prefetch_locked(entry, bytes, device, transfer);
}

void Manager::prefetch_newest(c10::Device device, int64_t count) {
  device = target_device(device, "prefetch_newest");
  DeviceTransfer* transfer = transfer_for(device);
  if (config_.synchronous || transfer == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  issue_batch_locked();
  prefetch_walk_locked(save_order_.end(), device, transfer, count, /*reads=*/0);
}

void Manager::start_prefetch_locked(Entry& entry, const void* bytes, c10::Device device,
                                    DeviceTransfer* transfer) {
  std::tie(entry.prefetched, entry.prefetch_done) =
      transfer->copy_to_device(host_tensor(entry, bytes), device, entry.to_host_done);
  entry.last_fence = entry.prefetch_done;
  counters_.prefetches++;
}

void Manager::prefetch_before_locked(const Entry& restored, c10::Device device,
                                     DeviceTransfer* transfer) {
  // Backward restores in reverse save order: the entries saved just before this one come next.
  if (transfer == nullptr && !disk_) return;  // nothing to copy ahead, nothing to read ahead
  const int64_t copies = prefetch_depth();
  // Only disk-tier entries are read ahead; without a disk tier the walk ends with the copies (it
  // would otherwise pass every earlier entry on each restore).
  const int64_t reads = copies > 0 && disk_ ? std::max(copies, config_.disk_read_ahead) : 0;
  prefetch_walk_locked(restored.order_pos, device, transfer, copies, reads);
}

void Manager::prefetch_walk_locked(std::list<const void*>::iterator before, c10::Device device,
                                   DeviceTransfer* transfer, int64_t copies, int64_t reads) {
  for (auto pos = before; (copies > 0 || reads > 0) && pos != save_order_.begin();) {
    --pos;
    Entry& candidate = entries_.at(*pos);
    if (candidate.restored || candidate.source_device != device) continue;
    if (candidate.kept_source.defined()) continue;  // on the device already
    const void* bytes = candidate.stored->resident();
    if (bytes == nullptr) {  // bytes not in host memory: read ahead
      if (reads > 0) {
        reads--;
        candidate.stored->read_ahead();
      }
      continue;
    }
    if (transfer == nullptr || copies <= 0) continue;
    copies--;
    if (!candidate.prefetched.defined()) start_prefetch_locked(candidate, bytes, device, transfer);
  }
}

void Manager::set_prefetch_depth(int64_t depth) {
  TORCH_CHECK(depth >= 0, "prefetch_depth must be >= 0, got ", depth);
  prefetch_depth_.store(depth, std::memory_order_relaxed);
}

void Manager::check_unmodified(const Entry& entry) const {
  check_version(entry.version_counter, entry.saved_version,
                "offload_restore: the tensor passed to offload_save");
}

}  // namespace torch_offload
