#pragma once
// The fixture of the Manager tests (test_manager.cpp, test_manager_in_flight.cpp,
// test_manager_prefetch_pool.cpp, test_manager_window.cpp): a Manager on CPU tensors driven through
// the fake asynchronous DeviceTransfer, with a counting host allocator, and checks that a test
// leaves no handle and no host memory behind. It lives in a named namespace, not an anonymous one:
// GoogleTest fails a suite whose tests derive from more than one fixture class, which each file
// would otherwise get (separate translation units when the tests are not a unity build).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "counting_allocator.h"
#include "csrc/manager.h"
#include "fake_transfer.h"
#include "test_util.h"

namespace torch_offload {
namespace manager_test {

using namespace std::chrono_literals;
using testing::AllocatorCounters;
using testing::Completion;
using testing::CountingAllocator;
using testing::error_of;
using testing::eventually;
using testing::FakeTransfer;
using testing::finishes_within;
using testing::kSettle;
using testing::make_config;
using Kind = FakeTransfer::Kind;

using testing::kCPU;

// Distinct, deterministic contents for each (seed, dtype).
inline at::Tensor make_tensor(at::IntArrayRef sizes, at::ScalarType dtype, int64_t seed = 0) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  at::Tensor values = at::arange(n, at::kLong).mul_(7).add_(seed * 13 + 1).remainder_(251);
  if (dtype == at::kBool) return values.remainder(2).to(at::kBool).reshape(sizes);
  if (at::isFloatingType(dtype)) {
    return values.to(at::kFloat).div_(8).sub_(10).to(dtype).reshape(sizes);
  }
  return values.sub_(100).to(dtype).reshape(sizes);
}

class ManagerTest : public ::testing::Test {
 protected:
  void make(ManagerConfig config, Completion mode = Completion::kImmediate) {
    transfer_ = std::make_shared<FakeTransfer>(mode);
    manager_ = Manager::create(config, transfer_, std::make_unique<CountingAllocator>(counters_));
  }

  void TearDown() override {
    if (!manager_) return;
    // Nothing may stay pending, or the manager's releaser would wait for it forever.
    if (transfer_) transfer_->complete_all();
    manager_->synchronize();
    const OffloadStats s = manager_->stats();
    EXPECT_EQ(s.live_handles, 0) << "a test leaked a handle";
    EXPECT_EQ(s.host_bytes_in_use, 0);
    manager_.reset();
    EXPECT_EQ(counters_->live_blocks, 0) << "the pool did not free its blocks";
  }

  at::Tensor save(const at::Tensor& x) { return manager_->save(x); }
  at::Tensor restore(const at::Tensor& h) { return manager_->restore(h, kCPU); }
  OffloadStats stats() { return manager_->stats(); }

  std::shared_ptr<AllocatorCounters> counters_ = std::make_shared<AllocatorCounters>();
  std::shared_ptr<FakeTransfer> transfer_;
  std::shared_ptr<Manager> manager_;
};

// A source whose memory outlives the tensor (the fake copy reads it when its fence completes, as
// a DMA would only after the compute stream's wait), with a flag set when the tensor lets go.
struct WatchedSource {
  explicit WatchedSource(int64_t n) : data(n), freed(std::make_shared<std::atomic<bool>>(false)) {
    for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(i) + 0.25f;
  }
  at::Tensor tensor() {
    auto flag = freed;
    return at::from_blob(
        data.data(), {static_cast<int64_t>(data.size())}, [flag](void*) { *flag = true; },
        at::kFloat);
  }
  at::Tensor expected() const {
    return at::arange(static_cast<int64_t>(data.size()), at::kFloat).add_(0.25);
  }
  std::vector<float> data;
  std::shared_ptr<std::atomic<bool>> freed;
};

}  // namespace manager_test
using namespace manager_test;  // NOLINT: the fixture's names, for the test files
}  // namespace torch_offload
