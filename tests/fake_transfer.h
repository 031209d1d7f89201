#pragma once
// A CPU DeviceTransfer that behaves like an asynchronous one: every copy is queued and only happens
// when its fence completes, and the test decides when that is. Copies capture raw pointers, never
// tensors, exactly like a DMA engine: if the manager lets a source or destination go before the
// copy's fence completed, the copy touches freed memory (AddressSanitizer reports it in the
// sanitizer build, and the data comes out wrong otherwise).
//
// Completion modes:
//   kImmediate   fences complete as soon as they are created (a very fast device);
//   kManual      fences complete only when the test calls complete()/complete_all();
//   kBackground  a background thread completes fences in FIFO order after a short random delay.
// In every mode compute_waits_for(f) completes f (and what it depends on) before returning: the
// CPU "compute stream" is the calling thread, and waiting for a copy means its bytes are in place
// before anything reads them.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "csrc/device_transfer.h"

namespace torch_offload::testing {

class FakeFence final : public CopyFence {
 public:
  FakeFence(std::function<void()> copy, std::shared_ptr<FakeFence> depends_on)
      : copy_(std::move(copy)), depends_on_(std::move(depends_on)) {}

  bool query() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  void synchronize() override {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return done_; });
  }

  // Performs the copy (once) and marks the fence complete. A copy queued after another fence
  // (copy_to_device's `ready`) cannot finish before it, so that one is completed first.
  void complete() {
    if (depends_on_) depends_on_->complete();
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    if (copy_) copy_();
    copy_ = nullptr;
    done_ = true;
    done_cv_.notify_all();
  }

  bool done() {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  std::function<void()> copy_;
  const std::shared_ptr<FakeFence> depends_on_;
  bool done_ = false;
};
using FakeFencePtr = std::shared_ptr<FakeFence>;

enum class Completion { kImmediate, kManual, kBackground };

inline const char* completion_name(Completion mode) {
  switch (mode) {
    case Completion::kImmediate:
      return "Immediate";
    case Completion::kManual:
      return "Manual";
    case Completion::kBackground:
      return "Background";
  }
  return "?";
}

// Test names and failure messages show the mode by name.
inline void PrintTo(Completion mode, std::ostream* os) { *os << completion_name(mode); }

class FakeTransfer final : public DeviceTransfer {
 public:
  enum class Kind { kToHost, kToDevice, kComputeWait };
  struct Call {
    Kind kind;
    const void* host_ptr = nullptr;  // the host side of the copy (the handle's buffer)
    size_t nbytes = 0;
    c10::Device device{c10::kCPU};
    FakeFencePtr fence;  // the copy's fence, or the fence waited for
    FakeFencePtr ready;  // copy_to_device only: the fence it was queued after
  };

  explicit FakeTransfer(Completion mode = Completion::kImmediate) : mode_(mode) {
    if (mode_ == Completion::kBackground) start_background();
  }

  ~FakeTransfer() override {
    stop_background();
    complete_all();
  }

  FencePtr copy_to_host(const at::Tensor& src, const at::Tensor& dst) override {
    EXPECT_TRUE(src.is_contiguous());
    EXPECT_TRUE(dst.is_contiguous());
    EXPECT_TRUE(dst.is_cpu());
    EXPECT_EQ(src.nbytes(), dst.nbytes());
    const size_t nbytes = std::min(src.nbytes(), dst.nbytes());
    const void* from = src.const_data_ptr();
    void* to = dst.data_ptr();
    auto fence = std::make_shared<FakeFence>(
        [from, to, nbytes] {
          if (nbytes > 0) std::memcpy(to, from, nbytes);
        },
        nullptr);
    record(Call{Kind::kToHost, to, nbytes, src.device(), fence, nullptr});
    schedule(fence);
    return fence;
  }

  // One fence for the batch; a Call per copy (kToHost), all with that fence.
  FencePtr copy_to_host_batch(const std::vector<std::pair<at::Tensor, at::Tensor>>& copies,
                              c10::Stream producer) override {
    TORCH_CHECK(!fail_batches_, "fake transfer: the batch could not be issued");
    std::vector<std::function<void()>> memcpys;
    for (const auto& [src, dst] : copies) {
      EXPECT_TRUE(src.is_contiguous());
      EXPECT_TRUE(dst.is_cpu());
      EXPECT_EQ(src.device(), producer.device());
      EXPECT_EQ(src.nbytes(), dst.nbytes());
      const size_t nbytes = std::min(src.nbytes(), dst.nbytes());
      const void* from = src.const_data_ptr();
      void* to = dst.data_ptr();
      memcpys.emplace_back([from, to, nbytes] {
        if (nbytes > 0) std::memcpy(to, from, nbytes);
      });
    }
    auto fence = std::make_shared<FakeFence>(
        [memcpys] {
          for (const auto& copy : memcpys) copy();
        },
        nullptr);
    batches_++;
    for (const auto& [src, dst] : copies) {
      record(Call{Kind::kToHost, dst.data_ptr(), dst.nbytes(), src.device(), fence, nullptr});
    }
    schedule(fence);
    return fence;
  }
  // copy_to_host_batch calls so far.
  int batches() const { return batches_.load(); }
  // copy_to_host_batch throws from now on (a driver error), before queueing anything.
  void fail_batches(bool fail) { fail_batches_ = fail; }

  std::pair<at::Tensor, FencePtr> copy_to_device(const at::Tensor& host, c10::Device device,
                                                 const FencePtr& ready) override {
    EXPECT_TRUE(host.is_cpu());
    EXPECT_TRUE(host.is_contiguous());
    FakeFencePtr ready_fake = std::dynamic_pointer_cast<FakeFence>(ready);
    EXPECT_EQ(ready_fake == nullptr, ready == nullptr) << "ready is not a fence of this transfer";
    at::Tensor out = at::empty(host.sizes(), host.options().device(device));
    const size_t nbytes = host.nbytes();
    const void* from = host.const_data_ptr();
    void* to = out.data_ptr();
    auto fence = std::make_shared<FakeFence>(
        [from, to, nbytes] {
          if (nbytes > 0) std::memcpy(to, from, nbytes);
        },
        ready_fake);
    record(Call{Kind::kToDevice, from, nbytes, device, fence, ready_fake});
    schedule(fence);
    return {out, fence};
  }

  void compute_waits_for(const FencePtr& fence, c10::Device device) override {
    FakeFencePtr fake = std::dynamic_pointer_cast<FakeFence>(fence);
    if (fake == nullptr) {
      ADD_FAILURE() << "compute_waits_for got a null or foreign fence";
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!fake->done()) wait_ms_ += 1.0;  // a stall of the "compute stream", 1 ms each
    }
    record(Call{Kind::kComputeWait, nullptr, 0, device, fake, nullptr});
    fake->complete();
  }

  double compute_wait_ms() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return wait_ms_;
  }

  void reset_compute_wait() override {
    std::lock_guard<std::mutex> lock(mutex_);
    wait_ms_ = 0.0;
  }

  // ---- test controls ----

  // Switching to kImmediate completes everything pending.
  void set_mode(Completion mode) {
    ASSERT_NE(mode, Completion::kBackground) << "choose kBackground in the constructor";
    stop_background();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mode_ = mode;
    }
    if (mode == Completion::kImmediate) complete_all();
  }

  void complete_all() {
    for (auto& call : calls()) {
      if (call.fence) call.fence->complete();
    }
  }

  std::vector<Call> calls() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }

  std::vector<Call> calls(Kind kind) {
    std::vector<Call> out;
    for (auto& call : calls()) {
      if (call.kind == kind) out.push_back(call);
    }
    return out;
  }

  // Fences of the copies made so far of `kind` (kToHost or kToDevice), oldest first.
  std::vector<FakeFencePtr> fences(Kind kind) {
    std::vector<FakeFencePtr> out;
    for (auto& call : calls(kind)) out.push_back(call.fence);
    return out;
  }

  int64_t count(Kind kind) { return static_cast<int64_t>(calls(kind).size()); }

  int64_t pending() {
    int64_t n = 0;
    for (auto& call : calls()) {
      if (call.kind != Kind::kComputeWait && !call.fence->done()) n++;
    }
    return n;
  }

 private:
  std::atomic<int> batches_{0};
  std::atomic<bool> fail_batches_{false};

  void record(Call call) {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.push_back(std::move(call));
  }

  void schedule(const FakeFencePtr& fence) {
    Completion mode;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mode = mode_;
      if (mode == Completion::kBackground) {
        background_queue_.push_back(fence);
        background_cv_.notify_one();
      }
    }
    if (mode == Completion::kImmediate) fence->complete();
  }

  void start_background() {
    background_ = std::thread([this] {
      std::mt19937 rng(1234);
      std::uniform_int_distribution<int> delay_us(0, 200);
      std::unique_lock<std::mutex> lock(mutex_);
      for (;;) {
        background_cv_.wait(lock, [this] { return stopping_ || !background_queue_.empty(); });
        if (background_queue_.empty()) return;
        FakeFencePtr fence = std::move(background_queue_.front());
        background_queue_.pop_front();
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
        fence->complete();
        fence.reset();
        lock.lock();
      }
    });
  }

  void stop_background() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    background_cv_.notify_all();
    if (background_.joinable()) background_.join();
  }

  std::mutex mutex_;
  Completion mode_;
  std::vector<Call> calls_;
  double wait_ms_ = 0.0;
  std::deque<FakeFencePtr> background_queue_;
  std::condition_variable background_cv_;
  bool stopping_ = false;
  std::thread background_;
};

}  // namespace torch_offload::testing
