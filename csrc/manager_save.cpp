// The Manager's save side (manager.h): a save's copy to host memory and its entry, the batch of
// device-to-host copies issued together, and the release of the sources those copies read.
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <functional>
#include <iterator>
#include <utility>
#include <vector>

#include "manager.h"

namespace torch_offload {

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

// The sources of copies to host memory: released in stream order on request (finish_save), else by
// the releaser once their copies have finished.
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

}  // namespace torch_offload
