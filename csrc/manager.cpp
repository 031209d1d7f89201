#include "manager.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <tuple>

#include "cuda_transfer.h"
#include "manager_registry.h"

namespace torch_offload {
namespace {

// "cuda" and "cuda:0" must name the same place when matching prefetched copies.
c10::Device with_index(c10::Device device) {
  if (device.is_cpu() || device.has_index()) return device;
  return c10::impl::getDeviceGuardImpl(device.type())->getDevice();
}

}  // namespace

std::shared_ptr<Manager> Manager::create(const ManagerConfig& config,
                                         std::shared_ptr<DeviceTransfer> transfer,
                                         std::unique_ptr<HostAllocator> allocator) {
  std::shared_ptr<Manager> manager(new Manager(config, std::move(transfer), std::move(allocator)));
  manager->id_ = register_manager(manager);
  return manager;
}

Manager::Manager(const ManagerConfig& config, std::shared_ptr<DeviceTransfer> transfer,
                 std::unique_ptr<HostAllocator> allocator)
    : config_(config), transfer_for_all_devices_(transfer != nullptr) {
  TORCH_CHECK(config.max_in_flight >= 0, "max_in_flight must be >= 0, got ", config.max_in_flight);
  TORCH_CHECK(config.prefetch_depth >= 0, "prefetch_depth must be >= 0, got ",
              config.prefetch_depth);
  transfer_ =
      transfer ? std::move(transfer) : std::shared_ptr<DeviceTransfer>(make_cuda_transfer());
  if (!allocator) allocator = make_default_host_allocator();
  const bool pinned = allocator->pinned();
  pool_ = std::make_shared<HostBufferPool>(std::move(allocator), config.host_budget_bytes);
  TORCH_CHECK(!config.disk_only || !config.disk_dir.empty(),
              "torch_offload: the disk mode needs a disk_dir");
  if (!config.disk_dir.empty()) {
    disk_ = std::make_unique<DiskStore>(config.disk_dir, static_cast<int>(config.io_threads));
    staging_pool_ = std::make_shared<HostBufferPool>(
        pinned ? make_default_host_allocator() : make_pageable_allocator(), 0);
  }
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

at::Tensor Manager::make_handle(const HostBlock& block, const at::Tensor& like) {
  auto self = shared_from_this();
  return at::from_blob(
      block.ptr, like.sizes(), [self, block](void*) { self->on_handle_freed(block); },
      like.options().device(c10::kCPU).pinned_memory(false));
}

at::Tensor Manager::save(const at::Tensor& x) {
  TORCH_CHECK(x.defined(), "offload_save: got an undefined tensor");
  TORCH_CHECK(x.layout() == c10::kStrided && !x.is_quantized(),
              "offload_save: only dense strided tensors can be offloaded, got layout ", x.layout());
  DeviceTransfer* transfer = transfer_for(x.device());
  if (disk_) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!disk_error_.empty()) {
      const std::string error = std::move(disk_error_);
      disk_error_.clear();
      TORCH_CHECK(false, "torch_offload: the disk tier failed: ", error,
                  ". Tensors saved before stay in host memory and restore correctly; free space "
                  "in disk_dir or choose another one. Nothing was offloaded by this call.");
    }
  }
  // Sources are copied as one contiguous run of bytes; a non-contiguous view costs one extra copy.
  const at::Tensor src = x.contiguous();
  std::optional<HostBlock> block;
  if (!config_.disk_only) {
    // Without a disk tier an over-budget request throws here, before anything changed.
    block = disk_ ? pool_->try_acquire(src.nbytes()) : pool_->acquire(src.nbytes());
  }
  if (config_.release_sources_on_save) finish_all_saves();
  if (!block) return save_to_disk(x, src, transfer);

  at::Tensor handle = make_handle(*block, src);
  const ToHostCopy copy = copy_to_host(src, handle, transfer);
  Entry entry;
  entry.host_view = at::from_blob(block->ptr, src.sizes(), handle.options());
  std::lock_guard<std::mutex> lock(mutex_);
  add_entry_locked(block->ptr, std::move(entry), x, copy);
  return handle;
}

Manager::ToHostCopy Manager::copy_to_host(const at::Tensor& src, const at::Tensor& dst,
                                          DeviceTransfer* transfer) {
  ToHostCopy copy;
  if (src.nbytes() == 0) return copy;
  if (transfer == nullptr) {
    dst.copy_(src);
    return copy;
  }
  if (config_.synchronous) {
    copy.done = transfer->copy_to_host(src, dst);
    copy.done->synchronize();  // the source is released when the caller drops it
    return copy;
  }
  copy.host_wait_ms = releaser_.wait_in_flight_below(config_.max_in_flight);
  copy.done = transfer->copy_to_host(src, dst);
  // The source stays alive until the copy has read it; then its memory returns to the compute
  // stream's pool. No record_stream needed.
  copy.source = std::make_shared<SourceSlot>(src);
  FencePtr done = copy.done;
  std::shared_ptr<SourceSlot> source = copy.source;
  releaser_.release_after([done] { done->synchronize(); }, [source] { source->release(); },
                          /*counts_in_flight=*/true);
  return copy;
}

void Manager::add_entry_locked(const void* key, Entry entry, const at::Tensor& x,
                               const ToHostCopy& copy) {
  entry.source_device = with_index(x.device());
  entry.nbytes = x.nbytes();
  if (x.unsafeGetTensorImpl()->version_counter().enabled()) {
    entry.version_counter = x.unsafeGetTensorImpl()->version_counter();
    entry.saved_version = entry.version_counter.current_version();
  }
  entry.to_host_done = copy.done;
  entry.last_fence = copy.done;
  entry.source = copy.source;
  save_order_.push_back(key);
  entry.order_pos = std::prev(save_order_.end());
  entries_.emplace(key, std::move(entry));
  counters_.saves++;
  counters_.bytes_to_host += static_cast<int64_t>(x.nbytes());
  counters_.host_wait_ms += copy.host_wait_ms;
}

Manager::HeldSource Manager::take_source_locked(Entry& entry) {
  HeldSource held{std::move(entry.source), entry.to_host_done, entry.source_device};
  entry.source = nullptr;
  return held;
}

void Manager::release_in_stream_order(const HeldSource& held) {
  DeviceTransfer* transfer = transfer_for(held.device);
  if (transfer != nullptr && held.done) transfer->compute_waits_for(held.done, held.device);
  held.source->release();
}

void Manager::finish_all_saves() {
  std::vector<HeldSource> held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, entry] : entries_) {
      if (entry.source) held.push_back(take_source_locked(entry));
    }
  }
  for (const HeldSource& h : held) release_in_stream_order(h);
}

void Manager::finish_save(const at::Tensor& handle) {
  HeldSource held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(handle.storage().data());
    if (it == entries_.end() || !it->second.source) return;  // nothing held (CPU, synchronous)
    held = take_source_locked(it->second);
  }
  release_in_stream_order(held);
}

void Manager::check_unmodified(const Entry& entry) const {
  if (!entry.version_counter.enabled()) return;
  const uint32_t now = entry.version_counter.current_version();
  TORCH_CHECK(now == entry.saved_version,
              "offload_restore: the tensor passed to offload_save was modified in place after it "
              "was saved (its version went from ",
              entry.saved_version, " to ", now,
              "), so the offloaded copy is stale. Save it after the in-place operation, or clone "
              "it before modifying it.");
}

at::Tensor Manager::restore(const at::Tensor& handle, c10::Device device) {
  TORCH_CHECK(handle.defined() && handle.is_cpu(),
              "offload_restore: the handle must be the CPU tensor returned by offload_save");
  device = with_index(device);
  DeviceTransfer* transfer = transfer_for(device);
  std::unique_lock<std::mutex> lock(mutex_);
  // Handles are found by their buffer (the storage's base), so views of a handle are recognised
  // too.
  auto it = entries_.find(handle.storage().data());
  const bool is_handle = it != entries_.end() && handle.storage_offset() == 0 &&
                         it->second.host_view.sizes() == handle.sizes() &&
                         it->second.host_view.strides() == handle.strides() &&
                         it->second.host_view.dtype() == handle.dtype();
  if (!is_handle) {
    // A view of a handle (its transpose, a slice), a copy of one, or any host tensor: restoring it
    // is a plain copy to `device`, once the handle's own copy has landed in host memory.
    const FencePtr landed = it != entries_.end() ? it->second.to_host_done : nullptr;
    counters_.restores++;
    counters_.bytes_to_device += static_cast<int64_t>(handle.nbytes());
    lock.unlock();
    if (landed) landed->synchronize();
    return handle.to(device, /*non_blocking=*/false, /*copy=*/true);
  }
  Entry& entry = it->second;
  check_unmodified(entry);
  if (entry.file_id >= 0) return restore_from_disk(it->first, device, transfer, lock);
  at::Tensor out;
  if (entry.prefetched.defined() && entry.prefetched.device() == device) {
    out = std::move(entry.prefetched);
    entry.prefetched = at::Tensor();
    transfer->compute_waits_for(entry.prefetch_done, device);
    counters_.prefetch_hits++;
  } else {
    out = copy_for_restore_locked(entry, entry.host_view, device, transfer);
  }
  finish_restore_locked(entry, out, device, transfer);
  return out;
}

at::Tensor Manager::copy_for_restore_locked(Entry& entry, const at::Tensor& host,
                                            c10::Device device, DeviceTransfer* transfer) {
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
  device = with_index(device);
  DeviceTransfer* transfer = transfer_for(device);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(handle.storage().data());
  TORCH_CHECK(
      it != entries_.end(),
      "prefetch: the tensor is not a live handle of this manager (offload_save returns one)");
  Entry& entry = it->second;
  if (config_.synchronous || transfer == nullptr || entry.file_id >= 0 ||
      entry.prefetched.defined()) {
    return;
  }
  check_unmodified(entry);
  start_prefetch_locked(entry, device, transfer);
}

void Manager::start_prefetch_locked(Entry& entry, c10::Device device, DeviceTransfer* transfer) {
  std::tie(entry.prefetched, entry.prefetch_done) =
      transfer->copy_to_device(entry.host_view, device, entry.to_host_done);
  entry.last_fence = entry.prefetch_done;
  counters_.prefetches++;
}

void Manager::prefetch_before_locked(const Entry& restored, c10::Device device,
                                     DeviceTransfer* transfer) {
  // Backward restores in reverse save order: the entries saved just before this one come next.
  int64_t budget = config_.prefetch_depth;
  for (auto pos = restored.order_pos; budget > 0 && pos != save_order_.begin();) {
    --pos;
    Entry& candidate = entries_.at(*pos);
    if (candidate.restored || candidate.source_device != device) continue;
    if (candidate.file_id >= 0) {  // disk tier: read ahead into host memory
      budget--;
      if (!candidate.read_staging && !candidate.read_pending && !candidate.write_pending &&
          !candidate.staging) {
        start_disk_read_locked(*pos, candidate);
      }
      continue;
    }
    if (transfer == nullptr) continue;
    budget--;
    if (!candidate.prefetched.defined()) start_prefetch_locked(candidate, device, transfer);
  }
}

void Manager::on_handle_freed(const HostBlock& block) {
  FencePtr last;
  at::Tensor prefetched;
  std::vector<std::pair<std::shared_ptr<HostBufferPool>, HostBlock>> blocks;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = entries_.find(block.ptr);
    if (it != entries_.end()) {
      Entry& entry = it->second;
      if (entry.file_id >= 0) {
        release_disk_entry(entry, lock);  // waits for the entry's IO, removes its file
        it = entries_.find(block.ptr);    // the wait unlocked: iterators may be stale
        if (entry.staging) blocks.emplace_back(staging_pool_, *entry.staging);
        if (entry.read_staging) blocks.emplace_back(staging_pool_, *entry.read_staging);
      }
      last = entry.last_fence;
      prefetched = std::move(entry.prefetched);
      save_order_.erase(entry.order_pos);
      entries_.erase(it);
    }
  }
  // Disk entries' handles own a small key block of their own, not a pool buffer.
  if (block.size > 0) blocks.emplace_back(pool_, block);
  auto release = [blocks, prefetched]() mutable {
    prefetched = at::Tensor();
    for (auto& [pool, b] : blocks) pool->release(b);
  };
  // A copy may still read or write these buffers (or the unused prefetched copy): release them
  // only once it has finished, so the pools never hand out memory a DMA is still touching.
  if (last && !last->query()) {
    releaser_.release_after([last] { last->synchronize(); }, std::move(release),
                            /*counts_in_flight=*/false);
  } else {
    release();
  }
}

OffloadStats Manager::stats() {
  const PoolStats pool = pool_->stats();
  std::lock_guard<std::mutex> lock(mutex_);
  OffloadStats s = counters_;
  s.in_flight_peak = releaser_.in_flight_peak();
  s.host_bytes_in_use = pool.bytes_in_use;
  s.host_bytes_peak = pool.bytes_peak;
  s.host_bytes_cached = pool.bytes_cached;
  s.pool_hits = pool.hits;
  s.pool_misses = pool.misses;
  s.host_allocations = pool.allocations;
  s.live_handles = static_cast<int64_t>(entries_.size());
  s.pinned = pool_->pinned();
  s.compute_wait_ms = transfer_ ? transfer_->compute_wait_ms() : 0.0;
  if (disk_) {
    s.disk_files = disk_->files_on_disk();
    s.disk_bytes_written = disk_->bytes_written();
    s.disk_bytes_read = disk_->bytes_read();
  }
  return s;
}

void Manager::reset_stats() {
  pool_->reset_counters();
  releaser_.reset_peak();
  if (transfer_) transfer_->reset_compute_wait();
  std::lock_guard<std::mutex> lock(mutex_);
  counters_ = OffloadStats{};
}

void Manager::synchronize() {
  std::vector<FencePtr> fences;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    io_done_.wait(lock, [this] {
      if (pending_writes_ > 0) return false;
      for (auto& [key, entry] : entries_) {
        if (entry.read_pending) return false;
      }
      return true;
    });
    for (auto& [key, entry] : entries_) {
      if (entry.last_fence) fences.push_back(entry.last_fence);
    }
  }
  for (auto& fence : fences) fence->synchronize();
  releaser_.drain();
}

void Manager::empty_pool() { pool_->empty_cache(); }

}  // namespace torch_offload
