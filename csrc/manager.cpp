#include "manager.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <tuple>
#include <utility>

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
  const bool kept = window_.keeps(static_cast<int64_t>(src.nbytes()), transfer != nullptr);
  // Queued, not issued: the batch issues the copy and commits it (issue_batch_locked).
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
      batch_full = batch_.full();
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

// The batch of device-to-host copies (copy_batch.h): a save on the batching thread queues its copy
// (its entry marked copy_pending, with no fence and no source yet), and the batch is issued at
// end_batch, when it is full, and before anything uses a pending copy.
void Manager::begin_batch() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (batch_.open_on_this_thread()) {
    batch_.nest();
    return;
  }
  // Another thread's batch is issued now, and that thread's saves copy one by one from here on
  // (its end_batch finds the batch taken over): one batching thread at a time.
  issue_batch_locked();
  batch_.take_over();
}

void Manager::end_batch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!batch_.close()) return;  // nested, never begun, or taken over
  }
  issue_batch();
}

bool Manager::joins_batch(const at::Tensor& src, const DeviceTransfer* transfer,
                          const Tier* tier) const {
  return transfer != nullptr && !config_.synchronous && tier == host_.get() && src.nbytes() > 0 &&
         batch_.open_on_this_thread();
}

void Manager::add_to_batch_locked(const void* key, const at::Tensor& src,
                                  const at::Tensor& destination) {
  const c10::Stream producer = CopyBatch::producer_of(src);
  if (!batch_.accepts(producer)) issue_batch_locked();  // one producer each
  entries_.at(key).copy_pending = true;
  batch_.add(CopyBatch::Copy{key, src, destination}, producer);
}

void Manager::issue_batch() {
  bool any_pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    any_pending = !batch_.empty();
  }
  if (!any_pending) return;
  // Outside the lock: the releaser's progress needs no lock of ours, restores go on meanwhile.
  const double waited = releaser_.wait_in_flight_below(config_.max_in_flight);
  std::lock_guard<std::mutex> lock(mutex_);
  counters_.host_wait_ms += waited;
  issue_batch_locked();
}

void Manager::issue_batch_locked() {
  if (batch_.empty()) return;
  const c10::Stream producer = batch_.stream();
  std::vector<CopyBatch::Copy> batch = batch_.take();
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  copies.reserve(batch.size());
  for (const CopyBatch::Copy& pending : batch) {
    copies.emplace_back(pending.source, pending.destination);
  }
  FencePtr done;
  try {
    done = transfer_for(batch.front().source.device())->copy_to_host_batch(copies, producer);
  } catch (...) {
    // Nothing was copied for sure: each entry keeps its source, as a kept save does.
    for (CopyBatch::Copy& pending : batch) {
      Entry& entry = entries_.at(pending.key);
      entry.copy_pending = false;
      entry.kept_source = std::move(pending.source);
    }
    throw;
  }
  std::vector<std::shared_ptr<SourceSlot>> sources;
  sources.reserve(batch.size());
  for (CopyBatch::Copy& pending : batch) {
    Entry& entry = entries_.at(pending.key);
    entry.copy_pending = false;
    entry.stored->commit(done);
    ToHostCopy copy;
    copy.done = done;
    copy.source = std::make_shared<SourceSlot>(std::move(pending.source));
    set_copy_to_host(entry, copy);
    sources.push_back(copy.source);
  }
  // One release for the batch: the worker only moves the sources to finished_sources_.
  const auto count = static_cast<int64_t>(sources.size());
  releaser_.release_after([done] { done->synchronize(); },
                          [this, sources = std::move(sources)] {
                            for (const auto& source : sources)
                              finished_sources_.add(source->take());
                          },
                          /*copies_in_flight=*/count);
  counters_.batched_copies += count;
  counters_.copy_batches++;
}

void Manager::set_prefetch_depth(int64_t depth) {
  TORCH_CHECK(depth >= 0, "prefetch_depth must be >= 0, got ", depth);
  prefetch_depth_.store(depth, std::memory_order_relaxed);
}

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

// The restore side: finding a handle's entry, restoring it (from its kept source, a device
// prefetch or its tier), and prefetching what backward needs next.
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
