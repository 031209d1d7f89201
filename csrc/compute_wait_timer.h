#pragma once
// How long the compute stream sat idle waiting for copies (the compute_wait_ms statistic): a pair
// of timing events around each wait, read once both have completed. The pairs are reused (creating
// a CUDA event is a driver call), and completed pairs are read back as new waits come, so that a
// run that never asks for statistics holds a bounded number of events. CUDA builds only.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace torch_offload {

class ComputeWaitTimer {
 public:
  // Makes `compute` wait for `copy_done`, timed.
  void wait(const c10::cuda::CUDAStream& compute, at::cuda::CUDAEvent& copy_done);
  // Milliseconds waited in the waits that have completed.
  double waited_ms();
  void reset();
  // Timed waits whose events have not been read back yet (for tests).
  size_t pending();

 private:
  struct Pair {
    at::cuda::CUDAEvent start{cudaEventDefault};
    at::cuda::CUDAEvent end{cudaEventDefault};
  };
  // Read back once this many waits are pending: more than one backward's restores in flight.
  static constexpr size_t kReadBackAbove = 256;
  // Reads back the completed pairs. On the hot path (`oldest_only`) it stops at the first pair
  // still pending: waits on one compute stream complete in order, so the scan costs one query per
  // completed pair instead of one per pending pair.
  void read_back_locked(bool oldest_only = false);
  // Adds a completed pair's time and keeps the pair for reuse.
  void retire_locked(std::unique_ptr<Pair> pair);

  std::mutex mutex_;
  std::deque<std::unique_ptr<Pair>> pending_;  // in the order recorded
  // Read-back pairs by device (an event is recorded on its first device's streams only).
  std::unordered_map<c10::DeviceIndex, std::vector<std::unique_ptr<Pair>>> spare_;
  double waited_ms_ = 0.0;
};

}  // namespace torch_offload
