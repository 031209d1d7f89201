#include "compute_wait_timer.h"

namespace torch_offload {

void ComputeWaitTimer::wait(const c10::cuda::CUDAStream& compute, at::cuda::CUDAEvent& copy_done) {
  std::unique_ptr<Pair> pair;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.size() >= kReadBackAbove) read_back_locked(/*oldest_only=*/true);
    std::vector<std::unique_ptr<Pair>>& spare = spare_[compute.device_index()];
    if (!spare.empty()) {
      pair = std::move(spare.back());
      spare.pop_back();
    }
  }
  if (!pair) pair = std::make_unique<Pair>();
  pair->start.record(compute);
  copy_done.block(compute);
  pair->end.record(compute);
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back(std::move(pair));
}

void ComputeWaitTimer::read_back_locked(bool oldest_only) {
  if (oldest_only) {
    while (!pending_.empty() && pending_.front()->end.query()) {
      retire_locked(std::move(pending_.front()));
      pending_.pop_front();
    }
    return;
  }
  // Every pending pair whose end has completed; the others stay in order.
  std::deque<std::unique_ptr<Pair>> still_pending;
  for (auto& pair : pending_) {
    if (pair->end.query()) {
      retire_locked(std::move(pair));
    } else {
      still_pending.push_back(std::move(pair));
    }
  }
  pending_.swap(still_pending);
}

void ComputeWaitTimer::retire_locked(std::unique_ptr<Pair> pair) {
  waited_ms_ += pair->start.elapsed_time(pair->end);
  spare_[pair->end.device_index()].push_back(std::move(pair));
}

double ComputeWaitTimer::waited_ms() {
  std::lock_guard<std::mutex> lock(mutex_);
  read_back_locked();
  return waited_ms_;
}

void ComputeWaitTimer::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  read_back_locked();
  waited_ms_ = 0.0;
}

size_t ComputeWaitTimer::pending() {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size();
}

}  // namespace torch_offload
