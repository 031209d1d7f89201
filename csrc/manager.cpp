#include "manager.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <tuple>

#include "cuda_transfer.h"
#include "fault_injection.h"
#include "manager_registry.h"
#include "version_check.h"

namespace torch_offload {
// "cuda" and "cuda:0" must name the same place when matching prefetched copies.
c10::Device Manager::with_index(c10::Device device) {
  if (device.is_cpu() || device.has_index()) return device;
  return c10::impl::getDeviceGuardImpl(device.type())->getDevice();
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
    : config_(config), transfer_for_all_devices_(transfer != nullptr) {
  TORCH_CHECK(config.max_in_flight >= 0, "max_in_flight must be >= 0, got ", config.max_in_flight);
  TORCH_CHECK(config.prefetch_depth >= 0, "prefetch_depth must be >= 0, got ",
              config.prefetch_depth);
  check_keep_on_device_bytes(config.keep_on_device_bytes);
  keep_limit_ = config.keep_on_device_bytes;
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
  if (!config.disk_only) save_tiers_.push_back(host_.get());
  if (!config.disk_dir.empty()) {
    disk_ = std::make_unique<DiskTier>(
        config.disk_dir, static_cast<int>(config.io_threads), config.max_in_flight,
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

at::Tensor Manager::save(const at::Tensor& x) {
  finished_sources_.drop();
  TORCH_CHECK(x.defined(), "offload_save: got an undefined tensor");
  TORCH_CHECK(x.layout() == c10::kStrided && !x.is_quantized(),
              "offload_save: only dense strided tensors can be offloaded, got layout ", x.layout());
  TORCH_CHECK(!x.is_nested(),
              "offload_save: got a nested tensor; offload its components (unbind()) instead");
  TORCH_CHECK(!x.is_meta(),
              "offload_save: got a meta tensor, which has no data to offload (under "
              "torch.compile or FakeTensor tracing the Python fake kernel runs instead)");
  DeviceTransfer* transfer = transfer_for(x.device());
  for (Tier* tier : save_tiers_) tier->check_before_save();
  // Sources are copied as one contiguous run of bytes; a non-contiguous view costs one extra copy.
  const at::Tensor src = x.contiguous();
  std::shared_ptr<StoredTensor> stored;
  size_t tier_index = 0;
  for (; !stored; ++tier_index) {
    // Without a next tier an over-budget request throws here, before anything changed.
    const bool may_decline = tier_index + 1 < save_tiers_.size();
    stored = save_tiers_[tier_index]->reserve(src.nbytes(), may_decline);
  }
  if (config_.release_sources_on_save) finish_all_saves();
  const bool kept = keeps_on_device(src, transfer);
  // Queued, not issued: the batch issues the copy and commits it (manager_batch.cpp).
  const bool batched = !kept && joins_batch(src, transfer, save_tiers_[tier_index - 1]);

  ToHostCopy copy;
  at::Tensor handle;
  at::Tensor destination;
  try {
    if (kept) {
      // No copy now: the window's oldest entries are copied out under the lock, once this save
      // is in it; wait for the in-flight bound here, on their behalf.
      copy.host_wait_ms = releaser_.wait_in_flight_below(config_.max_in_flight);
    } else {
      destination =
          at::from_blob(stored->destination(), src.sizes(), src.options().device(c10::kCPU));
      if (!batched) copy = copy_to_host(src, destination, transfer);
    }
    handle = make_handle(*stored, src);
    if (!kept && !batched) stored->commit(copy.done);
  } catch (...) {
    // The copy may still write the tier's memory: free it once the copy has finished.
    std::function<void()> free = stored->release();
    const FencePtr done = copy.done;
    if (done && !done->query()) {
      releaser_.release_after([done] { done->synchronize(); }, std::move(free),
                              /*copies_in_flight=*/0);
    } else {
      free();
    }
    throw;
  }
  Entry entry;
  entry.stored = std::move(stored);
  entry.sizes = handle.sizes().vec();
  entry.strides = handle.strides().vec();
  entry.dtype = src.scalar_type();
  const void* key = handle.storage().data_ptr().get_context();
  bool batch_full = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (tier_index > 1) counters_.spills++;  // the first tier declined it
    if (kept) entry.kept_source = src;
    add_entry_locked(key, std::move(entry), x, copy);
    if (batched) {
      add_to_batch_locked(key, src, destination);
      batch_full = pending_.size() >= kMaxBatch;
    }
  }
  if (batch_full) issue_batch();
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
  const double host_wait_ms = releaser_.wait_in_flight_below(config_.max_in_flight);
  copy = start_copy_to_host(src, dst, transfer);
  copy.host_wait_ms = host_wait_ms;
  return copy;
}

Manager::ToHostCopy Manager::start_copy_to_host(const at::Tensor& src, const at::Tensor& dst,
                                                DeviceTransfer* transfer) {
  ToHostCopy copy;
  copy.done = transfer->copy_to_host(src, dst);
  // The source stays alive until the copy has read it; then its memory returns to the compute
  // stream's pool. No record_stream needed.
  copy.source = std::make_shared<SourceSlot>(src);
  FencePtr done = copy.done;
  std::shared_ptr<SourceSlot> source = copy.source;
  // The worker only moves the source to finished_sources_: see source_slot.h.
  releaser_.release_after([done] { done->synchronize(); },
                          [this, source] { finished_sources_.add(source->take()); },
                          /*copies_in_flight=*/1);
  return copy;
}

void Manager::add_entry_locked(const void* key, Entry entry, const at::Tensor& x,
                               const ToHostCopy& copy) {
  entry.source_device = with_index(x.device());
  if (x.unsafeGetTensorImpl()->version_counter().enabled()) {
    entry.version_counter = x.unsafeGetTensorImpl()->version_counter();
    entry.saved_version = entry.version_counter.current_version();
  }
  set_copy_to_host(entry, copy);
  save_order_.push_back(key);
  entry.order_pos = std::prev(save_order_.end());
  Entry& added = entries_.emplace(key, std::move(entry)).first->second;
  counters_.saves++;
  counters_.host_wait_ms += copy.host_wait_ms;
  if (added.kept_source.defined()) {
    enter_window_locked(key, added);  // counted in bytes_to_host if and when it is copied
  } else {
    counters_.bytes_to_host += static_cast<int64_t>(x.nbytes());
  }
}

void Manager::set_copy_to_host(Entry& entry, const ToHostCopy& copy) {
  entry.to_host_done = copy.done;
  entry.last_fence = copy.done;
  entry.source = copy.source;
}

void Manager::saved_again(const void* key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  save_order_.splice(save_order_.end(), save_order_, it->second.order_pos);  // iterators stay valid
}

Manager::HeldSource Manager::take_source_locked(Entry& entry) {
  HeldSource held{std::move(entry.source), entry.to_host_done, entry.source_device};
  entry.source = nullptr;
  return held;
}

void Manager::release_in_stream_order(const HeldSource& held) {
  DeviceTransfer* transfer = transfer_for(held.device);
  if (transfer != nullptr && held.done) transfer->compute_waits_for(held.done, held.device);
  const at::Tensor dropped = held.source->take();  // on this (the caller's) thread
  // If the copy finished meanwhile, the releaser may have taken the source first and parked it in
  // finished_sources_: drop it now too, so the source is gone when this returns either way.
  finished_sources_.drop();
}

void Manager::finish_all_saves() {
  std::vector<HeldSource> held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    issue_batch_locked();  // a pending copy has no fence to wait for yet
    for (auto& [key, entry] : entries_) {
      if (entry.source) held.push_back(take_source_locked(entry));
    }
  }
  for (const HeldSource& h : held) release_in_stream_order(h);
}

void Manager::finish_save(const at::Tensor& handle) {
  finished_sources_.drop();
  HeldSource held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* entry = find_entry_locked(handle, "finish_save");
    if (entry != nullptr && entry->copy_pending) issue_batch_locked();
    if (entry == nullptr || !entry->source) return;  // nothing held (CPU, synchronous)
    held = take_source_locked(*entry);
  }
  release_in_stream_order(held);
}

void Manager::check_unmodified(const Entry& entry) const {
  check_version(entry.version_counter, entry.saved_version,
                "offload_restore: the tensor passed to offload_save");
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
    s.window_bytes = window_bytes_;
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
