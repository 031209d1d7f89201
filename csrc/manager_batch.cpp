// Manager's batches of device-to-host copies (Manager::begin_batch): a selected module's saves
// queue their copies, and the module's end issues them together. A copy on its own costs four
// driver calls (an event on the compute stream, the side stream's wait for it, the copy, its done
// event) and a wake-up of the releaser; a batch of N costs N + 3 calls (4 where the runtime issues
// the N copies in one call: cuda_transfer.cpp) and one wake-up.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <utility>

#include "manager.h"

namespace torch_offload {

void Manager::begin_batch() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (batch_thread_.load() == std::this_thread::get_id()) {
    batch_depth_++;
    return;
  }
  // Another thread's batch is issued now, and that thread's saves copy one by one from here on
  // (its end_batch finds the batch taken over): one batching thread at a time.
  issue_batch_locked();
  batch_thread_ = std::this_thread::get_id();
  batch_depth_ = 1;
}

void Manager::end_batch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (batch_thread_.load() != std::this_thread::get_id()) return;  // never begun, or taken over
    if (--batch_depth_ > 0) return;
    batch_thread_ = std::thread::id{};
  }
  issue_batch();
}

bool Manager::joins_batch(const at::Tensor& src, const DeviceTransfer* transfer,
                          const Tier* tier) const {
  return transfer != nullptr && !config_.synchronous && tier == host_.get() && src.nbytes() > 0 &&
         batch_thread_.load() == std::this_thread::get_id();
}

void Manager::add_to_batch_locked(const void* key, const at::Tensor& src,
                                  const at::Tensor& destination) {
  const c10::Stream producer =
      c10::impl::getDeviceGuardImpl(src.device().type())->getStream(src.device());
  if (!pending_.empty() && producer != batch_stream_) issue_batch_locked();  // one producer each
  batch_stream_ = producer;
  entries_.at(key).copy_pending = true;
  pending_.push_back(PendingCopy{key, src, destination});
}

void Manager::issue_batch() {
  bool any_pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    any_pending = !pending_.empty();
  }
  if (!any_pending) return;
  // Outside the lock: the releaser's progress needs no lock of ours, restores go on meanwhile.
  const double waited = releaser_.wait_in_flight_below(config_.max_in_flight);
  std::lock_guard<std::mutex> lock(mutex_);
  counters_.host_wait_ms += waited;
  issue_batch_locked();
}

void Manager::issue_batch_locked() {
  if (pending_.empty()) return;
  std::vector<PendingCopy> batch;
  batch.swap(pending_);
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  copies.reserve(batch.size());
  for (const PendingCopy& pending : batch) copies.emplace_back(pending.source, pending.destination);
  FencePtr done;
  try {
    done = transfer_for(batch.front().source.device())->copy_to_host_batch(copies, batch_stream_);
  } catch (...) {
    // Nothing was copied for sure: each entry keeps its source, as a kept save does.
    for (PendingCopy& pending : batch) {
      Entry& entry = entries_.at(pending.key);
      entry.copy_pending = false;
      entry.kept_source = std::move(pending.source);
    }
    throw;
  }
  std::vector<std::shared_ptr<SourceSlot>> sources;
  sources.reserve(batch.size());
  for (PendingCopy& pending : batch) {
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

}  // namespace torch_offload
