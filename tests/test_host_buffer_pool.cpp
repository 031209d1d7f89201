// HostBufferPool: reuse across steps, rounding and best fit, the host budget, allocator failure.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "counting_allocator.h"
#include "csrc/host_buffer_pool.h"
#include "test_util.h"

namespace torch_offload {
namespace {

using testing::AllocatorCounters;
using testing::CountingAllocator;
using testing::error_of;

constexpr size_t kG = HostBufferPool::kGranularity;

class HostBufferPoolTest : public ::testing::Test {
 protected:
  std::unique_ptr<HostBufferPool> make_pool(int64_t budget_bytes = 0) {
    return std::make_unique<HostBufferPool>(std::make_unique<CountingAllocator>(counters_),
                                            budget_bytes);
  }

  std::shared_ptr<AllocatorCounters> counters_ = std::make_shared<AllocatorCounters>();
};

TEST_F(HostBufferPoolTest, SteadyStateStepsReuseBlocksWithoutNewAllocations) {
  auto pool = make_pool();
  const std::vector<size_t> step_sizes = {1, 4096, 10000, 1 << 20, 3 * (1 << 20) + 17, 4096};

  auto run_step = [&] {
    std::vector<HostBlock> blocks;
    for (size_t bytes : step_sizes) {
      HostBlock block = pool->acquire(bytes);
      EXPECT_NE(block.ptr, nullptr);
      EXPECT_GE(block.size, bytes);
      blocks.push_back(block);
    }
    for (auto& block : blocks) pool->release(block);
  };

  run_step();
  const PoolStats first = pool->stats();
  EXPECT_EQ(first.misses, static_cast<int64_t>(step_sizes.size()));
  EXPECT_EQ(first.hits, 0);
  EXPECT_EQ(first.allocations, static_cast<int64_t>(step_sizes.size()));
  EXPECT_EQ(first.bytes_in_use, 0);
  EXPECT_GT(first.bytes_cached, 0);
  const int64_t allocator_calls = counters_->allocations;

  for (int step = 2; step <= 5; ++step) {
    run_step();
    const PoolStats s = pool->stats();
    EXPECT_EQ(s.allocations, first.allocations) << "step " << step;
    EXPECT_EQ(s.misses, first.misses) << "step " << step;
    EXPECT_EQ(s.hits, static_cast<int64_t>(step_sizes.size()) * (step - 1)) << "step " << step;
    EXPECT_EQ(s.bytes_in_use, 0);
    EXPECT_EQ(s.bytes_cached, first.bytes_cached);
  }
  EXPECT_EQ(counters_->allocations, allocator_calls);
  EXPECT_EQ(counters_->releases, 0);
}

TEST_F(HostBufferPoolTest, RequestsAreRoundedToTheGranularity) {
  auto pool = make_pool();
  HostBlock zero = pool->acquire(0);
  HostBlock one = pool->acquire(1);
  HostBlock exact = pool->acquire(kG);
  HostBlock over = pool->acquire(kG + 1);
  EXPECT_EQ(zero.size, kG);
  EXPECT_NE(zero.ptr, nullptr);
  EXPECT_EQ(one.size, kG);
  EXPECT_EQ(exact.size, kG);
  EXPECT_EQ(over.size, 2 * kG);
  EXPECT_EQ(pool->stats().bytes_in_use, static_cast<int64_t>(5 * kG));
  for (auto& b : {zero, one, exact, over}) pool->release(b);

  // A slightly different size that rounds to the same block is a hit on that very block.
  HostBlock again = pool->acquire(kG + 100);
  EXPECT_EQ(again.ptr, over.ptr);
  EXPECT_EQ(again.size, 2 * kG);
  EXPECT_EQ(pool->stats().hits, 1);
  pool->release(again);
}

TEST_F(HostBufferPoolTest, BestFitDoesNotHandAMuchLargerBlockToATinyRequest) {
  auto pool = make_pool();
  HostBlock big = pool->acquire(1 << 20);
  pool->release(big);
  ASSERT_EQ(pool->stats().bytes_cached, 1 << 20);

  HostBlock tiny = pool->acquire(100);
  EXPECT_NE(tiny.ptr, big.ptr);
  EXPECT_EQ(tiny.size, kG);
  EXPECT_EQ(pool->stats().misses, 2);
  EXPECT_EQ(pool->stats().hits, 0);
  EXPECT_EQ(pool->stats().bytes_cached, 1 << 20) << "the large block must stay cached";

  // A request close enough to the cached size (it wastes under a quarter) does reuse it.
  HostBlock close = pool->acquire((1 << 20) - 40 * kG);
  EXPECT_EQ(close.ptr, big.ptr);
  EXPECT_EQ(close.size, static_cast<size_t>(1 << 20));
  EXPECT_EQ(pool->stats().hits, 1);

  // Among several cached blocks the smallest that fits is chosen.
  HostBlock b8 = pool->acquire(8 * kG);
  HostBlock b9 = pool->acquire(9 * kG);
  pool->release(b9);
  pool->release(b8);
  HostBlock fit = pool->acquire(8 * kG);
  EXPECT_EQ(fit.ptr, b8.ptr);

  for (auto& b : {tiny, close, fit}) pool->release(b);
}

TEST_F(HostBufferPoolTest, BudgetExceededByBlocksInUseThrowsNamingTheBudget) {
  const int64_t budget = 4 * kG;
  auto pool = make_pool(budget);
  HostBlock a = pool->acquire(2 * kG);
  const std::string message = error_of([&] { pool->acquire(3 * kG); });
  EXPECT_NE(message.find("host_budget_bytes"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(budget)), std::string::npos) << message;
  // Nothing changed: the failed request neither allocated nor counted as in use.
  EXPECT_EQ(pool->stats().bytes_in_use, static_cast<int64_t>(2 * kG));
  EXPECT_EQ(counters_->allocations, 1);

  // Exactly filling the budget is allowed.
  HostBlock b = pool->acquire(2 * kG);
  EXPECT_EQ(pool->stats().bytes_in_use, budget);
  pool->release(a);
  pool->release(b);
}

TEST_F(HostBufferPoolTest, CachedBlocksAreEvictedToStayWithinTheBudget) {
  const int64_t budget = 3 * kG;
  auto pool = make_pool(budget);
  HostBlock a = pool->acquire(kG);
  HostBlock b = pool->acquire(kG);
  HostBlock c = pool->acquire(kG);
  pool->release(a);
  pool->release(b);
  pool->release(c);
  ASSERT_EQ(pool->stats().bytes_cached, budget);

  // 2 blocks are needed: only cached bytes stand in the way, so enough of them are freed.
  HostBlock big = pool->acquire(2 * kG);
  const PoolStats s = pool->stats();
  EXPECT_EQ(s.bytes_in_use, static_cast<int64_t>(2 * kG));
  EXPECT_LE(s.bytes_in_use + s.bytes_cached, budget);
  EXPECT_EQ(s.bytes_cached, static_cast<int64_t>(kG)) << "only as much as needed is evicted";
  EXPECT_EQ(counters_->releases, 2);
  EXPECT_EQ(counters_->live_bytes, budget);
  pool->release(big);
}

TEST_F(HostBufferPoolTest, AllocatorFailureFreesCachedBlocksAndRetries) {
  auto pool = make_pool();
  counters_->capacity_bytes = 2 * kG;  // the "machine" has two blocks of RAM
  HostBlock a = pool->acquire(2 * kG);
  pool->release(a);
  ASSERT_EQ(pool->stats().bytes_cached, static_cast<int64_t>(2 * kG));

  // A 1-block request does not fit the cached 2-block one and the allocator is full: the pool
  // gives back its cache and tries again.
  HostBlock small = pool->acquire(kG);
  EXPECT_NE(small.ptr, nullptr);
  EXPECT_EQ(counters_->failures, 1);
  EXPECT_EQ(counters_->releases, 1);
  EXPECT_EQ(pool->stats().bytes_cached, 0);
  EXPECT_EQ(pool->stats().bytes_in_use, static_cast<int64_t>(kG));

  // Nothing left to give back: a clear error, and the pool is unchanged.
  const std::string message = error_of([&] { pool->acquire(2 * kG); });
  EXPECT_NE(message.find("host RAM exhausted"), std::string::npos) << message;
  EXPECT_EQ(pool->stats().bytes_in_use, static_cast<int64_t>(kG));
  EXPECT_EQ(pool->stats().allocations, 2);

  // Once memory is available again the pool works normally.
  counters_->capacity_bytes = -1;
  HostBlock later = pool->acquire(2 * kG);
  EXPECT_NE(later.ptr, nullptr);
  pool->release(small);
  pool->release(later);
}

TEST_F(HostBufferPoolTest, AllocatorFailureWithEmptyCacheIsAClearError) {
  auto pool = make_pool();
  counters_->fail_next = 1;
  const std::string message = error_of([&] { pool->acquire(100); });
  EXPECT_NE(message.find("host RAM exhausted"), std::string::npos) << message;
  EXPECT_EQ(pool->stats().bytes_in_use, 0);
  EXPECT_EQ(pool->stats().misses, 0);
  HostBlock ok = pool->acquire(100);  // the next call succeeds
  EXPECT_NE(ok.ptr, nullptr);
  pool->release(ok);
}

TEST_F(HostBufferPoolTest, EmptyCacheFreesOnlyCachedBlocks) {
  auto pool = make_pool();
  HostBlock kept = pool->acquire(kG);
  HostBlock a = pool->acquire(2 * kG);
  HostBlock b = pool->acquire(5 * kG);
  pool->release(a);
  pool->release(b);
  ASSERT_EQ(pool->stats().bytes_cached, static_cast<int64_t>(7 * kG));

  pool->empty_cache();
  EXPECT_EQ(pool->stats().bytes_cached, 0);
  EXPECT_EQ(pool->stats().bytes_in_use, static_cast<int64_t>(kG));
  EXPECT_EQ(counters_->releases, 2);
  EXPECT_EQ(counters_->live_blocks, 1);

  // The next request of a freed size is a fresh allocation.
  HostBlock c = pool->acquire(2 * kG);
  EXPECT_EQ(pool->stats().misses, 4);
  pool->release(c);
  pool->release(kept);
}

TEST_F(HostBufferPoolTest, DestructorFreesCachedBlocks) {
  {
    auto pool = make_pool();
    pool->release(pool->acquire(kG));
    pool->release(pool->acquire(10 * kG));
    EXPECT_EQ(counters_->live_blocks, 2);
  }
  EXPECT_EQ(counters_->live_blocks, 0);
  EXPECT_EQ(counters_->live_bytes, 0);
  EXPECT_EQ(counters_->releases, counters_->allocations);
}

TEST_F(HostBufferPoolTest, StatsTrackBytesInUseAndPeak) {
  auto pool = make_pool();
  HostBlock a = pool->acquire(kG);
  HostBlock b = pool->acquire(3 * kG);
  EXPECT_EQ(pool->stats().bytes_in_use, static_cast<int64_t>(4 * kG));
  EXPECT_EQ(pool->stats().bytes_peak, static_cast<int64_t>(4 * kG));
  pool->release(b);
  EXPECT_EQ(pool->stats().bytes_in_use, static_cast<int64_t>(kG));
  EXPECT_EQ(pool->stats().bytes_peak, static_cast<int64_t>(4 * kG));
  EXPECT_EQ(pool->stats().bytes_cached, static_cast<int64_t>(3 * kG));

  // A hit counts as in use too.
  HostBlock b2 = pool->acquire(3 * kG);
  HostBlock c = pool->acquire(2 * kG);
  EXPECT_EQ(pool->stats().bytes_in_use, static_cast<int64_t>(6 * kG));
  EXPECT_EQ(pool->stats().bytes_peak, static_cast<int64_t>(6 * kG));
  pool->release(b2);
  pool->release(c);

  pool->reset_counters();
  const PoolStats s = pool->stats();
  EXPECT_EQ(s.hits, 0);
  EXPECT_EQ(s.misses, 0);
  EXPECT_EQ(s.bytes_peak, static_cast<int64_t>(kG)) << "peak restarts from the current level";
  EXPECT_EQ(s.allocations, 3) << "allocations are a lifetime count";
  pool->release(a);
}

TEST_F(HostBufferPoolTest, NegativeBudgetIsRejected) { EXPECT_THROW(make_pool(-1), c10::Error); }

}  // namespace
}  // namespace torch_offload
