#pragma once
// A malloc-backed HostAllocator for tests: counts what it hands out, poisons fresh memory (so a
// test that reads a buffer before anything was copied into it sees garbage, not zeros), and can be
// told to fail, either for the next N calls or whenever a capacity would be exceeded (simulating
// exhausted host RAM). Its counters live in a shared object so that tests can still read them
// after the pool (which owns the allocator) is gone.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "csrc/host_allocator.h"

namespace torch_offload::testing {

struct AllocatorCounters {
  std::atomic<int64_t> allocations{0};  // successful allocate() calls
  std::atomic<int64_t> releases{0};
  std::atomic<int64_t> failures{0};  // allocate() calls answered with nullptr
  std::atomic<int64_t> live_blocks{0};
  std::atomic<int64_t> live_bytes{0};
  std::atomic<int64_t> capacity_bytes{-1};  // < 0: unlimited
  std::atomic<int64_t> fail_next{0};        // the next N allocate() calls fail
};

class CountingAllocator final : public HostAllocator {
 public:
  static constexpr unsigned char kPoison = 0xA5;

  explicit CountingAllocator(std::shared_ptr<AllocatorCounters> counters = nullptr,
                             bool pinned = false)
      : counters_(counters ? std::move(counters) : std::make_shared<AllocatorCounters>()),
        pinned_(pinned) {}

  ~CountingAllocator() override {
    // Whoever owns the allocator must have returned every block before destroying it.
    EXPECT_TRUE(sizes_.empty()) << sizes_.size() << " host blocks were never released";
  }

  void* allocate(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (counters_->fail_next > 0) {
      counters_->fail_next--;
      counters_->failures++;
      return nullptr;
    }
    const int64_t capacity = counters_->capacity_bytes;
    if (capacity >= 0 && counters_->live_bytes + static_cast<int64_t>(bytes) > capacity) {
      counters_->failures++;
      return nullptr;
    }
    void* ptr = std::malloc(bytes == 0 ? 1 : bytes);
    if (ptr == nullptr) return nullptr;
    std::memset(ptr, kPoison, bytes);
    sizes_.emplace(ptr, bytes);
    counters_->allocations++;
    counters_->live_blocks++;
    counters_->live_bytes += static_cast<int64_t>(bytes);
    return ptr;
  }

  void release(void* ptr) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sizes_.find(ptr);
    if (it == sizes_.end()) {
      ADD_FAILURE() << "release() of a pointer this allocator did not hand out (or a double free)";
      return;
    }
    counters_->releases++;
    counters_->live_blocks--;
    counters_->live_bytes -= static_cast<int64_t>(it->second);
    sizes_.erase(it);
    std::free(ptr);
  }

  bool pinned() const override { return pinned_; }

  const std::shared_ptr<AllocatorCounters>& counters() const { return counters_; }

 private:
  std::shared_ptr<AllocatorCounters> counters_;
  const bool pinned_;
  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;
};

}  // namespace torch_offload::testing
