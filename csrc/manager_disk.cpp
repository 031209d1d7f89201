// The disk tier of Manager: tensors go through a staging host buffer into one file each, written by
// the DiskStore's IO threads; restores (and prefetches) read them back into staging buffers.
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdlib>

#include "manager.h"

namespace torch_offload {

at::Tensor Manager::save_to_disk(const at::Tensor& x, const at::Tensor& src,
                                 DeviceTransfer* transfer) {
  TORCH_CHECK(disk_ != nullptr, "torch_offload: no disk tier configured");
  const size_t nbytes = src.nbytes();
  const auto options = src.options().device(c10::kCPU).pinned_memory(false);
  double waited_ms = 0.0;
  {
    // Each write in flight holds a staging buffer: bound them like device-to-host copies.
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t limit = std::max<int64_t>(1, config_.max_in_flight);
    const auto start = std::chrono::steady_clock::now();
    io_done_.wait(lock, [&] { return pending_writes_ < limit; });
    waited_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    pending_writes_++;
  }
  HostBlock staging;
  ToHostCopy copy;
  try {
    staging = staging_pool_->acquire(nbytes);
    copy = copy_to_host(src, at::from_blob(staging.ptr, src.sizes(), options), transfer);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_writes_--;
    if (staging.ptr != nullptr) staging_pool_->release(staging);
    io_done_.notify_all();
    throw;
  }

  // The handle holds no data: a zero-stride tensor over a small key block of its own, so that it
  // has the saved tensor's shape and dtype and a unique data pointer to find its entry by.
  void* key = std::malloc(16);
  TORCH_CHECK(key != nullptr, "torch_offload: out of host memory");
  auto self = shared_from_this();
  const std::vector<int64_t> zero_strides(src.dim(), 0);
  at::Tensor handle = at::from_blob(
      key, src.sizes(), zero_strides,
      [self, key](void*) {
        self->on_handle_freed(HostBlock{key, 0});
        std::free(key);
      },
      options);

  Entry entry;
  entry.host_view = at::from_blob(key, src.sizes(), zero_strides, options);
  entry.file_id = disk_->new_file();
  entry.staging = staging;
  entry.write_pending = true;
  const int64_t file_id = entry.file_id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!config_.disk_only) counters_.spills++;
    copy.host_wait_ms += waited_ms;
    add_entry_locked(key, std::move(entry), x, copy);
  }
  FencePtr done = copy.done;
  disk_->write_async(
      file_id,
      [done] {
        if (done) done->synchronize();
      },
      staging.ptr, nbytes,
      [this, key](const std::string& error) {
        std::lock_guard<std::mutex> lock(mutex_);
        pending_writes_--;
        // The entry exists: a handle's deleter waits for its write before erasing it.
        Entry& e = entries_.at(key);
        e.write_pending = false;
        if (error.empty()) {
          staging_pool_->release(*e.staging);
          e.staging.reset();
        } else if (disk_error_.empty()) {
          disk_error_ = error;  // the data stays in e.staging, so nothing is lost
        }
        io_done_.notify_all();
      });
  return handle;
}

void Manager::start_disk_read_locked(const void* key, Entry& entry) {
  entry.read_pending = true;
  entry.read_error.clear();
  entry.read_staging = staging_pool_->acquire(entry.nbytes);
  disk_->read_async(entry.file_id, entry.read_staging->ptr, entry.nbytes,
                    [this, key](const std::string& error) {
                      std::lock_guard<std::mutex> lock(mutex_);
                      Entry& e = entries_.at(key);
                      e.read_pending = false;
                      e.read_error = error;
                      io_done_.notify_all();
                    });
}

at::Tensor Manager::restore_from_disk(const void* key, c10::Device device, DeviceTransfer* transfer,
                                      std::unique_lock<std::mutex>& lock) {
  // References into entries_ stay valid across the waits (no erase while our handle lives).
  Entry& entry = entries_.at(key);
  io_done_.wait(lock, [&] { return !entry.write_pending && !entry.read_pending; });
  HostBlock source;
  bool from_read = false;
  if (entry.staging) {
    source = *entry.staging;  // the write failed: the data never left host memory
  } else {
    if (!entry.read_staging) {
      start_disk_read_locked(key, entry);
      io_done_.wait(lock, [&] { return !entry.read_pending; });
    } else {
      counters_.prefetch_hits++;
    }
    TORCH_CHECK(
        entry.read_error.empty(),
        "torch_offload: reading an offloaded tensor back from disk failed: ", entry.read_error);
    source = *entry.read_staging;
    entry.read_staging.reset();
    from_read = true;
  }
  const at::Tensor host =
      at::from_blob(source.ptr, entry.host_view.sizes(), entry.host_view.options());
  const at::Tensor out = copy_for_restore_locked(entry, host, device, transfer);
  if (from_read) {
    // The read staging buffer goes back to its pool once the device copy has read it.
    auto pool = staging_pool_;
    const FencePtr fence = transfer != nullptr ? entry.last_fence : nullptr;
    if (fence) {
      releaser_.release_after([fence] { fence->synchronize(); },
                              [pool, source] { pool->release(source); },
                              /*counts_in_flight=*/false);
    } else {
      pool->release(source);
    }
  }
  finish_restore_locked(entry, out, device, transfer);
  return out;
}

void Manager::release_disk_entry(Entry& entry, std::unique_lock<std::mutex>& lock) {
  io_done_.wait(lock, [&] { return !entry.write_pending && !entry.read_pending; });
  disk_->remove(entry.file_id);
}

}  // namespace torch_offload
