#include "deferred_releaser.h"

#include <chrono>

#include "elapsed.h"
#include "thread_start.h"

namespace torch_offload {

DeferredReleaser::DeferredReleaser()
    : worker_(start_thread("the offload manager's releaser thread (it frees offloaded tensors' "
                           "memory once their copies finish)",
                           FaultSite::kReleaserThreadStart, [this] { run(); })) {}

DeferredReleaser::~DeferredReleaser() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  worker_.join();
}

void DeferredReleaser::release_after(Fence fence, Payload payload, int64_t copies_in_flight) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Item{std::move(fence), std::move(payload), copies_in_flight});
    in_flight_ += copies_in_flight;
    in_flight_peak_ = std::max(in_flight_peak_, in_flight_);
  }
  work_ready_.notify_one();
}

void DeferredReleaser::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and fully drained
    Item item = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    const int64_t counted = item.copies_in_flight;
    item.fence();
    item.payload();
    // Destroy the closures (and the tensors/buffers they hold) before reporting progress.
    item = Item{};
    lock.lock();
    busy_ = false;
    in_flight_ -= counted;
    progress_.notify_all();
  }
}

double DeferredReleaser::wait_in_flight_below(int64_t limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (limit <= 0 || in_flight_ < limit) return 0.0;
  const auto start = std::chrono::steady_clock::now();
  progress_.wait(lock, [&] { return in_flight_ < limit; });
  return ms_since(start);
}

void DeferredReleaser::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  progress_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

int64_t DeferredReleaser::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_;
}

int64_t DeferredReleaser::in_flight_peak() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_peak_;
}

void DeferredReleaser::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  in_flight_peak_ = in_flight_;
}

}  // namespace torch_offload
