#pragma once
// The batch of device-to-host copies (Manager::begin_batch / end_batch): the saves of the batching
// thread queue their copies here, and the Manager issues them together, with one ordering point
// after the compute stream and one fence for all. Why: a copy on its own costs four driver calls
// (an event on the compute stream, the side stream's wait for it, the copy, its done event) and a
// wake-up of the releaser; a batch of N costs N + 3 calls (4 where the runtime issues the N copies
// in one call: cuda_transfer.cpp) and one wake-up (a selected module's call in mode "modules").
//
// What it holds: the pending copies in save order, the stream that produced their sources, and the
// thread whose saves are batched with the depth of its nested begin_batch calls. Invariants: the
// pending copies' sources all come from one stream (the batch is ordered after that stream's
// work), and one thread batches at a time. A pending copy's source stays on the device until the
// batch is issued, so the Manager issues it at kMaxCopies and before anything uses a pending copy.
//
// Locking: guarded by Manager::mutex_ (a pending copy's entry is the Manager's, marked
// copy_pending), under which every member is called, except open_on_this_thread(): a save reads it
// before it takes the lock, so the batching thread is atomic (it is written under the lock).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace torch_offload {

class CopyBatch {
 public:
  static constexpr size_t kMaxCopies = 16;

  struct Copy {
    const void* key;         // the Manager's entry
    at::Tensor source;       // contiguous, on the device
    at::Tensor destination;  // the entry's host memory
  };

  CopyBatch() = default;
  CopyBatch(const CopyBatch&) = delete;
  CopyBatch& operator=(const CopyBatch&) = delete;

  // Whether the calling thread's saves are batched now.
  bool open_on_this_thread() const { return thread_.load() == std::this_thread::get_id(); }
  // A begin_batch inside the calling thread's open batch: one level deeper.
  void nest() { depth_++; }
  // A begin_batch on a thread whose batch is not open: the batch is this thread's from now on
  // (another thread's saves copy one by one again, and its end_batch finds the batch taken over).
  // The caller has issued the pending copies first.
  void take_over();
  // An end_batch: true when it closes the calling thread's outermost begin_batch (the caller issues
  // the pending copies then); false for a nested one, and where this thread's batch was never
  // begun or was taken over.
  bool close();

  // The current stream of `src`'s device: the stream that produced a save's source.
  static c10::Stream producer_of(const at::Tensor& src);
  // Whether a copy whose source `producer` made may join the pending ones (one producer each);
  // if not, the caller issues them first.
  bool accepts(const c10::Stream& producer) const {
    return pending_.empty() || producer == stream_;
  }
  void add(Copy copy, const c10::Stream& producer);
  bool empty() const { return pending_.empty(); }
  bool full() const { return pending_.size() >= kMaxCopies; }
  // The stream that produced the pending copies' sources.
  const c10::Stream& stream() const { return stream_; }
  // The pending copies, in save order; none are pending afterwards.
  std::vector<Copy> take();

 private:
  std::vector<Copy> pending_;
  c10::Stream stream_{c10::Stream::DEFAULT, c10::Device(c10::kCPU)};
  std::atomic<std::thread::id> thread_{};
  int depth_ = 0;
};

}  // namespace torch_offload
