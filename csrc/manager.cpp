// The Manager's core: construction and its checks, the devices it copies to, the handles (their
// storage's context and their release), and what concerns every entry at once (statistics,
// synchronize, the pool). The save side and its batches are in manager_save.cpp, the window of
// saves kept on the device in manager_window.cpp, the restore side and prefetch in
// manager_restore.cpp: one class, one mutex, its member definitions grouped by concern.
#include "manager.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <functional>
#include <utility>
#include <vector>

#include "cuda_transfer.h"
#include "fault_injection.h"
#include "manager_registry.h"

namespace torch_offload {
// "cuda" and "cuda:0" must name the same place when matching prefetched copies.
c10::Device Manager::with_index(c10::Device device) {
  if (device.is_cpu() || device.has_index()) return device;
  return c10::impl::getDeviceGuardImpl(device.type())->getDevice();
}

// Checked before with_index: without a GPU, asking CUDA for its current device fails with the
// driver's error, which names neither the op nor the device the caller passed.
c10::Device Manager::target_device(c10::Device device, const char* op) const {
  if (device.is_cpu() || transfer_for_all_devices_) return with_index(device);
  TORCH_CHECK(device.is_cuda(), op, ": device='", device, "' is not supported (CPU and CUDA are)");
  TORCH_CHECK(transfer_ != nullptr, op, ": device='", device,
              "', but no CUDA device is visible to this process (torch.cuda.is_available() is "
              "False) or torch_offload was built without CUDA");
  const c10::DeviceIndex count = c10::impl::getDeviceGuardImpl(device.type())->deviceCount();
  TORCH_CHECK(!device.has_index() || device.index() < count, op, ": device='", device,
              "', but this process sees ", static_cast<int>(count), " CUDA device(s)");
  return with_index(device);
}

std::shared_ptr<Manager> Manager::create(const ManagerConfig& config,
                                         std::shared_ptr<DeviceTransfer> transfer,
                                         std::unique_ptr<HostAllocator> allocator) {
  std::shared_ptr<Manager> manager(new Manager(config, std::move(transfer), std::move(allocator)));
  manager->id_ = register_manager(manager);
  return manager;
}

Manager::Manager(const ManagerConfig& config, std::shared_ptr<DeviceTransfer> transfer,
                 std::unique_ptr<HostAllocator> allocator)
    : config_(config),
      prefetch_depth_(config.prefetch_depth),
      transfer_for_all_devices_(transfer != nullptr) {
  TORCH_CHECK(config.max_in_flight >= 0, "max_in_flight must be >= 0, got ", config.max_in_flight);
  TORCH_CHECK(config.prefetch_depth >= 0, "prefetch_depth must be >= 0, got ",
              config.prefetch_depth);
  DeviceWindow::check_limit(config.keep_on_device_bytes, config);
  window_.set_limit(config.keep_on_device_bytes);
  transfer_ =
      transfer ? std::move(transfer) : std::shared_ptr<DeviceTransfer>(make_cuda_transfer());
  if (!allocator) allocator = make_default_host_allocator();
  const bool pinned = allocator->pinned();
  host_ = std::make_unique<HostTier>(
      std::make_shared<HostBufferPool>(std::move(allocator), config.host_budget_bytes));
  TORCH_CHECK(!config.disk_only || !config.disk_dir.empty(),
              "torch_offload: the disk mode needs a disk_dir");
  TORCH_CHECK(!(config.disk_direct_io && config.disk_direct_io_auto),
              "torch_offload: disk_direct_io is True or 'auto', not both");
  TORCH_CHECK(!(config.disk_direct_io || config.disk_direct_io_auto) || !config.disk_dir.empty(),
              "torch_offload: disk_direct_io=", config.disk_direct_io ? "True" : "'auto'",
              " is for the disk tier, and there is none without a disk_dir");
  TORCH_CHECK(config.disk_io_threads >= 1 && config.disk_io_threads <= kMaxDiskIoThreads,
              "torch_offload: disk_io_threads must be 1 to ", kMaxDiskIoThreads, ", got ",
              config.disk_io_threads);
  TORCH_CHECK(config.disk_io_threads == ManagerConfig{}.disk_io_threads || !config.disk_dir.empty(),
              "torch_offload: disk_io_threads=", config.disk_io_threads,
              " is for the disk tier, and there is none without a disk_dir");
  if (!config.disk_only) save_tiers_.push_back(host_.get());
  if (!config.disk_dir.empty()) {
    disk_ = std::make_unique<DiskTier>(
        config.disk_dir, static_cast<int>(config.disk_io_threads),
        pinned ? make_default_host_allocator() : make_pageable_allocator(),
        config.disk_direct_io        ? DirectIo::kAlways
        : config.disk_direct_io_auto ? DirectIo::kWhenRamIsShort
                                     : DirectIo::kNever);
    save_tiers_.push_back(disk_.get());
  }
  regions_ = std::make_unique<SavedRegions>(*this, default_backward_scope());
}

Manager::~Manager() { unregister_manager(id_); }

DeviceTransfer* Manager::transfer_for(c10::Device device) const {
  if (transfer_for_all_devices_) return transfer_.get();
  if (device.is_cpu()) return nullptr;
  TORCH_CHECK(device.is_cuda(), "torch_offload: device ", device,
              " is not supported (CPU and CUDA are)");
  TORCH_CHECK(transfer_ != nullptr, "torch_offload: got a tensor on ", device,
              " but this build of torch_offload has no CUDA support or no CUDA device is visible");
  return transfer_.get();
}

void Manager::free_handle(void* context) {
  std::unique_ptr<HandleContext> owned(static_cast<HandleContext*>(context));
  owned->manager->on_handle_freed(owned.get());
}

at::Tensor Manager::make_handle(StoredTensor& stored, const at::Tensor& like) {
  TORCH_CHECK(!fault_injected(FaultSite::kHandleContext),
              "offload_save: out of host memory (injected by a test)");
  auto context = std::make_unique<HandleContext>(HandleContext{shared_from_this()});
  c10::Storage storage(c10::Storage::use_byte_size_t(), like.nbytes(),
                       c10::DataPtr(stored.handle_data(), context.get(), &free_handle, c10::kCPU),
                       /*allocator=*/nullptr, /*resizable=*/false);
  context.release();  // the storage owns it now
  at::Tensor handle = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), like.dtype());
  handle.unsafeGetTensorImpl()->set_sizes_contiguous(like.sizes());
  return handle;
}

at::Tensor Manager::host_tensor(const Entry& entry, const void* data) const {
  // Contiguous: the tier holds the bytes of the contiguous source.
  return at::from_blob(const_cast<void*>(data), entry.sizes,
                       at::TensorOptions().dtype(entry.dtype).device(c10::kCPU));
}

void Manager::on_handle_freed(const void* key) {
  regions_->on_handle_freed(key);
  FencePtr last;
  at::Tensor prefetched;
  at::Tensor kept;  // dropped after the lock: a drop may run Python code (source_slot.h)
  std::shared_ptr<StoredTensor> stored;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;  // its save failed after making it
    Entry& entry = it->second;
    if (entry.copy_pending) {
      // Its memory must not be reused before the queued copy into it has run: issue the batch.
      // A deleter must not throw: if that fails, the entry holds its source (dropped below).
      try {
        issue_batch_locked();
      } catch (...) {
      }
    }
    if (entry.in_window) leave_window_locked(entry);
    kept = std::move(entry.kept_source);
    last = entry.last_fence;
    prefetched = std::move(entry.prefetched);
    stored = std::move(entry.stored);
    save_order_.erase(entry.order_pos);
    entries_.erase(it);
  }
  // Waits for the tier's IO on this tensor (a disk write), without the manager's lock.
  auto release = [free = stored->release(), prefetched]() mutable {
    prefetched = at::Tensor();
    free();
  };
  // A copy may still read or write the tier's memory (or the unused prefetched copy): release it
  // only once that copy has finished, so no buffer is handed out while a DMA still touches it.
  if (last && !last->query()) {
    releaser_.release_after([last] { last->synchronize(); }, std::move(release),
                            /*copies_in_flight=*/0);
  } else {
    release();
  }
}

OffloadStats Manager::stats() {
  finished_sources_.drop();
  OffloadStats s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = counters_;
    s.live_handles = static_cast<int64_t>(entries_.size());
    s.window_bytes = window_.bytes();
  }
  host_->add_stats(s);
  if (disk_) disk_->add_stats(s);
  regions_->add_stats(s);
  filters_.add_stats(s);
  s.in_flight_peak = releaser_.in_flight_peak();
  s.compute_wait_ms = transfer_ ? transfer_->compute_wait_ms() : 0.0;
  return s;
}

void Manager::reset_stats() {
  host_->reset_stats();
  regions_->reset_stats();
  filters_.reset_stats();
  if (disk_) disk_->reset_stats();
  releaser_.reset_peak();
  if (transfer_) transfer_->reset_compute_wait();
  std::lock_guard<std::mutex> lock(mutex_);
  counters_ = OffloadStats{};
}

void Manager::synchronize() {
  if (disk_) disk_->synchronize();
  std::vector<FencePtr> fences;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    issue_batch_locked();
    for (auto& [key, entry] : entries_) {
      if (entry.last_fence) fences.push_back(entry.last_fence);
    }
  }
  for (auto& fence : fences) fence->synchronize();
  releaser_.drain();
  finished_sources_.drop();
}

void Manager::empty_pool() {
  finished_sources_.drop();
  host_->empty_cache();
  if (disk_) disk_->empty_cache();
}

}  // namespace torch_offload
