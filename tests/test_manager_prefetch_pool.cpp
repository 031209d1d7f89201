// Manager on CPU tensors driven through a fake asynchronous DeviceTransfer (fake_transfer.h): the
// host buffer pool behind the manager and the host budget, prefetch (automatic and explicit), and
// statistics.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "csrc/host_buffer_pool.h"
#include "manager_fixture.h"

namespace torch_offload {
namespace {

// ---------------------------------------------------------------------------------------------
// The host buffer pool behind the manager.

TEST_F(ManagerTest, BuffersReturnToThePoolAndIdenticalStepsAllocateNothingNew) {
  make(make_config(2, 1, 0), Completion::kBackground);
  const std::vector<std::vector<int64_t>> shapes = {{1000}, {64, 80}, {3}, {128, 128}, {0}, {17}};
  auto step = [&](int64_t seed) {
    std::vector<at::Tensor> xs, hs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      xs.push_back(make_tensor(shapes[i], at::kFloat, seed + static_cast<int64_t>(i)));
      hs.push_back(save(xs.back()));
    }
    for (size_t i = shapes.size(); i-- > 0;) {
      EXPECT_TRUE(at::equal(restore(hs[i]), xs[i])) << "step " << seed << " tensor " << i;
    }
  };  // handles die here

  step(0);
  manager_->synchronize();
  const OffloadStats first = stats();
  EXPECT_EQ(first.host_bytes_in_use, 0);
  EXPECT_EQ(first.live_handles, 0);
  EXPECT_GT(first.host_bytes_cached, 0);
  EXPECT_EQ(first.host_allocations, static_cast<int64_t>(shapes.size()));
  const int64_t allocator_calls = counters_->allocations;

  for (int s = 1; s <= 3; ++s) {
    step(s * 100);
    manager_->synchronize();
    const OffloadStats now = stats();
    EXPECT_EQ(now.host_allocations, first.host_allocations) << "step " << s;
    EXPECT_EQ(now.pool_misses, first.pool_misses) << "step " << s;
    EXPECT_EQ(now.pool_hits, first.pool_hits + s * static_cast<int64_t>(shapes.size()));
    EXPECT_EQ(now.host_bytes_in_use, 0);
  }
  EXPECT_EQ(counters_->allocations, allocator_calls);

  manager_->empty_pool();
  EXPECT_EQ(stats().host_bytes_cached, 0);
  EXPECT_EQ(counters_->live_blocks, 0);
}

TEST_F(ManagerTest, HandleFreedDuringItsCopyKeepsItsBufferUntilTheFenceCompletes) {
  make(ManagerConfig{}, Completion::kManual);
  at::Tensor x = make_tensor({4096}, at::kFloat, 1);
  at::Tensor h = save(x);
  const int64_t bytes = stats().host_bytes_in_use;
  ASSERT_GT(bytes, 0);

  h = at::Tensor();
  EXPECT_EQ(stats().live_handles, 0);
  std::this_thread::sleep_for(kSettle);
  EXPECT_EQ(stats().host_bytes_in_use, bytes)
      << "the buffer went back to the pool while a copy was still writing it";
  EXPECT_EQ(stats().host_bytes_cached, 0);

  // A new save meanwhile must not be handed that buffer.
  at::Tensor y = make_tensor({4096}, at::kFloat, 2);
  at::Tensor hy = save(y);
  EXPECT_EQ(stats().pool_hits, 0);

  transfer_->fences(Kind::kToHost)[0]->complete();  // x's copy finishes; y's is still pending
  EXPECT_TRUE(eventually([&] { return stats().host_bytes_cached == bytes; }))
      << "x's buffer did not return to the pool after its copy completed";
  EXPECT_EQ(stats().host_bytes_in_use, bytes) << "only y's buffer is still in use";
  EXPECT_TRUE(at::equal(restore(hy), y));
}

TEST_F(ManagerTest, BudgetExceededOnSaveThrowsAndChangesNothing) {
  const int64_t budget = 4 * HostBufferPool::kGranularity;
  make(make_config(4, 1, budget));
  at::Tensor small = make_tensor({1024}, at::kFloat, 1);  // one block
  at::Tensor h = save(small);
  const OffloadStats before = stats();

  at::Tensor big = make_tensor({4 * 1024}, at::kFloat, 2);  // four blocks: over the budget
  const std::string message = error_of([&] { save(big); });
  EXPECT_NE(message.find("host_budget_bytes"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(budget)), std::string::npos) << message;
  const OffloadStats after = stats();
  EXPECT_EQ(after.live_handles, before.live_handles);
  EXPECT_EQ(after.saves, before.saves);
  EXPECT_EQ(after.bytes_to_host, before.bytes_to_host);
  EXPECT_EQ(after.host_bytes_in_use, before.host_bytes_in_use);
  EXPECT_EQ(transfer_->count(Kind::kToHost), 1);

  // The manager still works, and once the handle is gone the same save fits.
  EXPECT_TRUE(at::equal(restore(h), small));
  h = at::Tensor();
  at::Tensor hb = save(big);
  EXPECT_TRUE(at::equal(restore(hb), big));
}

// ---------------------------------------------------------------------------------------------
// Prefetch.

TEST_F(ManagerTest, RestoreStartsPrefetchOfThePreviouslySavedTensor) {
  make(make_config(4, 1, 0), Completion::kManual);
  at::Tensor a = make_tensor({300}, at::kFloat, 1);
  at::Tensor b = make_tensor({200}, at::kFloat, 2);
  at::Tensor c = make_tensor({100}, at::kFloat, 3);
  at::Tensor ha = save(a), hb = save(b), hc = save(c);
  auto to_host = transfer_->fences(Kind::kToHost);
  ASSERT_EQ(to_host.size(), 3u);

  EXPECT_TRUE(at::equal(restore(hc), c));
  auto to_device = transfer_->calls(Kind::kToDevice);
  ASSERT_EQ(to_device.size(), 2u) << "restore(C) copies C and prefetches B";
  EXPECT_EQ(to_device[0].host_ptr, hc.data_ptr());
  EXPECT_EQ(to_device[1].host_ptr, hb.data_ptr());
  EXPECT_EQ(to_device[1].ready, to_host[1]) << "B's prefetch must be queued after B's offload";
  EXPECT_FALSE(to_device[1].fence->done()) << "the prefetch is asynchronous";
  EXPECT_EQ(stats().prefetches, 1);
  EXPECT_EQ(stats().prefetch_hits, 0);

  EXPECT_TRUE(at::equal(restore(hb), b));
  EXPECT_EQ(stats().prefetch_hits, 1);
  EXPECT_EQ(stats().prefetches, 2);
  to_device = transfer_->calls(Kind::kToDevice);
  ASSERT_EQ(to_device.size(), 3u) << "B came from its prefetch; A's prefetch started";
  EXPECT_EQ(to_device[2].host_ptr, ha.data_ptr());
  // The compute stream waited for B's prefetched copy before B was used.
  auto waits = transfer_->calls(Kind::kComputeWait);
  ASSERT_FALSE(waits.empty());
  EXPECT_EQ(waits.back().fence, to_device[1].fence);

  EXPECT_TRUE(at::equal(restore(ha), a));
  EXPECT_EQ(stats().prefetch_hits, 2);
  EXPECT_EQ(stats().prefetches, 2) << "nothing was saved before A";
  EXPECT_EQ(transfer_->count(Kind::kToDevice), 3);
  EXPECT_EQ(stats().restores, 3);
}

TEST_F(ManagerTest, PrefetchDepthZeroDisablesPrefetch) {
  make(make_config(4, 0, 0));
  at::Tensor a = make_tensor({30}, at::kFloat, 1);
  at::Tensor b = make_tensor({20}, at::kFloat, 2);
  at::Tensor c = make_tensor({10}, at::kFloat, 3);
  at::Tensor ha = save(a), hb = save(b), hc = save(c);
  EXPECT_TRUE(at::equal(restore(hc), c));
  EXPECT_EQ(transfer_->count(Kind::kToDevice), 1);
  EXPECT_TRUE(at::equal(restore(hb), b));
  EXPECT_TRUE(at::equal(restore(ha), a));
  EXPECT_EQ(transfer_->count(Kind::kToDevice), 3);
  EXPECT_EQ(stats().prefetches, 0);
  EXPECT_EQ(stats().prefetch_hits, 0);
}

TEST_F(ManagerTest, PrefetchDepthTwoPrefetchesTwoAhead) {
  make(make_config(8, 2, 0));
  std::vector<at::Tensor> xs, hs;
  for (int i = 0; i < 5; ++i) {
    xs.push_back(make_tensor({50 + i}, at::kFloat, i));
    hs.push_back(save(xs.back()));
  }
  for (int i = 4; i >= 0; --i) EXPECT_TRUE(at::equal(restore(hs[i]), xs[i])) << i;
  EXPECT_EQ(stats().prefetches, 4);
  EXPECT_EQ(stats().prefetch_hits, 4);
  EXPECT_EQ(transfer_->count(Kind::kToDevice), 5) << "every tensor was copied back exactly once";
}

TEST_F(ManagerTest, SetPrefetchDepthAppliesToLaterRestores) {
  make(make_config(8, 1, 0));
  std::vector<at::Tensor> xs, hs;
  for (int i = 0; i < 4; ++i) {
    xs.push_back(make_tensor({40 + i}, at::kFloat, i));
    hs.push_back(save(xs.back()));
  }
  manager_->set_prefetch_depth(3);
  EXPECT_EQ(manager_->prefetch_depth(), 3);
  EXPECT_EQ(manager_->config().prefetch_depth, 1) << "the configuration it was made with stays";
  EXPECT_TRUE(at::equal(restore(hs[3]), xs[3]));
  EXPECT_EQ(stats().prefetches, 3) << "one restore copies the three earlier saves back";
  for (int i = 2; i >= 0; --i) EXPECT_TRUE(at::equal(restore(hs[i]), xs[i])) << i;
  EXPECT_EQ(stats().prefetch_hits, 3);
  EXPECT_EQ(transfer_->count(Kind::kToDevice), 4) << "every tensor was copied back exactly once";

  EXPECT_THROW(manager_->set_prefetch_depth(-1), c10::Error);
  EXPECT_EQ(manager_->prefetch_depth(), 3);
}

TEST_F(ManagerTest, ExplicitPrefetchServesEveryLaterRestoreItPrecedes) {
  // Layer offloading restores the same weights every step and prefetches them itself, in forward
  // order and in backward order: a prefetch must serve the next restore even after earlier ones.
  make(make_config(4, 0, 0));
  at::Tensor w = make_tensor({64}, at::kFloat, 1);
  at::Tensor hw = save(w);
  EXPECT_TRUE(at::equal(restore(hw), w));
  for (int step = 0; step < 3; ++step) {
    manager_->prefetch(hw, kCPU);
    manager_->prefetch(hw, kCPU);  // already pending: no second copy
    EXPECT_EQ(stats().prefetches, step + 1);
    EXPECT_TRUE(at::equal(restore(hw), w));
    EXPECT_EQ(stats().prefetch_hits, step + 1);
  }
  EXPECT_EQ(transfer_->count(Kind::kToDevice), 4) << "one plain restore, then three prefetches";
}

TEST_F(ManagerTest, PrefetchNewestCopiesTheNewestUnrestoredEntriesOnce) {
  // Called as backward starts: its first restores (the newest saves) then only wait.
  make(make_config(8, 0, 0));
  std::vector<at::Tensor> xs, hs;
  for (int i = 0; i < 4; ++i) {
    xs.push_back(make_tensor({40 + i}, at::kFloat, i));
    hs.push_back(save(xs.back()));
  }
  EXPECT_TRUE(at::equal(restore(hs[3]), xs[3]));  // restored already: skipped, not counted
  manager_->prefetch_newest(kCPU, 2);
  auto to_device = transfer_->calls(Kind::kToDevice);
  ASSERT_EQ(to_device.size(), 3u) << "the restore, then the two newest unrestored entries";
  EXPECT_EQ(to_device[1].host_ptr, hs[2].data_ptr());
  EXPECT_EQ(to_device[2].host_ptr, hs[1].data_ptr());
  manager_->prefetch_newest(kCPU, 2);  // pending already: no second copy
  EXPECT_EQ(stats().prefetches, 2);
  for (int i = 2; i >= 0; --i) EXPECT_TRUE(at::equal(restore(hs[i]), xs[i])) << i;
  EXPECT_EQ(stats().prefetch_hits, 2);
  EXPECT_EQ(transfer_->count(Kind::kToDevice), 4) << "every tensor copied back exactly once";
}

TEST_F(ManagerTest, ExplicitPrefetchChecksItsHandle) {
  make(make_config(4, 0, 0));
  at::Tensor w = make_tensor({64}, at::kFloat, 1);
  at::Tensor hw = save(w);
  const std::string unknown = error_of([&] { manager_->prefetch(w.clone(), kCPU); });
  EXPECT_NE(unknown.find("not a live handle"), std::string::npos) << unknown;
  w.add_(1);  // the saved tensor changed after save: the prefetch must not hand out stale data
  const std::string stale = error_of([&] { manager_->prefetch(hw, kCPU); });
  EXPECT_NE(stale.find("modified in place"), std::string::npos) << stale;
}

TEST_F(ManagerTest, ExplicitPrefetchIsANoOpForSynchronousManagers) {
  ManagerConfig config = make_config(4, 0, 0);
  config.synchronous = true;
  make(config);
  at::Tensor w = make_tensor({64}, at::kFloat, 1);
  at::Tensor hw = save(w);
  manager_->prefetch(hw, kCPU);
  EXPECT_EQ(stats().prefetches, 0);
  EXPECT_TRUE(at::equal(restore(hw), w));
}

TEST_F(ManagerTest, UnusedPrefetchIsReleasedWhenItsHandleDies) {
  make(make_config(4, 1, 0), Completion::kManual);
  at::Tensor a = make_tensor({2048}, at::kFloat, 1);
  at::Tensor b = make_tensor({2048}, at::kFloat, 2);
  at::Tensor ha = save(a), hb = save(b);
  EXPECT_TRUE(at::equal(restore(hb), b));  // starts A's prefetch, left pending
  ASSERT_EQ(stats().prefetches, 1);
  auto prefetch = transfer_->calls(Kind::kToDevice).back().fence;
  ASSERT_FALSE(prefetch->done());
  const int64_t a_bytes = stats().host_bytes_in_use / 2;

  ha = at::Tensor();  // A is never restored
  EXPECT_EQ(stats().live_handles, 1);
  std::this_thread::sleep_for(kSettle);
  EXPECT_EQ(stats().host_bytes_in_use, 2 * a_bytes)
      << "A's buffer returned to the pool while its prefetch copy still reads it";

  transfer_->complete_all();
  manager_->synchronize();
  EXPECT_EQ(stats().host_bytes_in_use, a_bytes);
}

// ---------------------------------------------------------------------------------------------
// Statistics.

TEST_F(ManagerTest, StatsCountSavesRestoresAndBytesAndResetClearsThem) {
  make(ManagerConfig{});
  at::Tensor x = make_tensor({100}, at::kFloat, 1);  // 400 bytes
  at::Tensor y = make_tensor({50}, at::kLong, 2);    // 400 bytes
  at::Tensor hx = save(x), hy = save(y);
  OffloadStats s = stats();
  EXPECT_EQ(s.saves, 2);
  EXPECT_EQ(s.bytes_to_host, 800);
  EXPECT_EQ(s.restores, 0);
  EXPECT_EQ(s.live_handles, 2);
  EXPECT_EQ(s.host_bytes_in_use, static_cast<int64_t>(2 * HostBufferPool::kGranularity));
  EXPECT_FALSE(s.pinned);

  restore(hy);
  restore(hx);
  restore(hx);
  s = stats();
  EXPECT_EQ(s.restores, 3);
  EXPECT_EQ(s.bytes_to_device, 1200);

  manager_->reset_stats();
  s = stats();
  EXPECT_EQ(s.saves, 0);
  EXPECT_EQ(s.restores, 0);
  EXPECT_EQ(s.bytes_to_host, 0);
  EXPECT_EQ(s.bytes_to_device, 0);
  EXPECT_EQ(s.prefetches, 0);
  EXPECT_EQ(s.prefetch_hits, 0);
  EXPECT_EQ(s.pool_hits, 0);
  EXPECT_EQ(s.pool_misses, 0);
  EXPECT_EQ(s.compute_wait_ms, 0.0);
  // Levels are not counters: they survive a reset.
  EXPECT_EQ(s.live_handles, 2);
  EXPECT_EQ(s.host_bytes_in_use, static_cast<int64_t>(2 * HostBufferPool::kGranularity));
  EXPECT_EQ(s.host_bytes_peak, s.host_bytes_in_use);

  restore(hx);
  EXPECT_EQ(stats().restores, 1);
  EXPECT_EQ(stats().bytes_to_device, 400);
}

TEST_F(ManagerTest, StatsItemsNameEveryCounter) {
  make(ManagerConfig{});
  at::Tensor h = save(make_tensor({10}, at::kFloat));
  const auto items = stats().items();
  auto value = [&](const std::string& name) {
    for (const auto& [k, v] : items) {
      if (k == name) return v;
    }
    ADD_FAILURE() << "no stat named " << name;
    return -1.0;
  };
  EXPECT_EQ(value("saves"), 1.0);
  EXPECT_EQ(value("bytes_to_host"), 40.0);
  EXPECT_EQ(value("live_handles"), 1.0);
  EXPECT_EQ(value("pinned"), 0.0);
  EXPECT_EQ(value("host_allocations"), 1.0);
}

TEST_F(ManagerTest, ComputeWaitIsReportedAndReset) {
  make(ManagerConfig{}, Completion::kManual);
  at::Tensor x = make_tensor({10}, at::kFloat);
  at::Tensor h = save(x);
  EXPECT_TRUE(at::equal(restore(h), x));  // its copy back was pending: the fake counts 1 ms
  EXPECT_GT(stats().compute_wait_ms, 0.0);
  manager_->reset_stats();
  EXPECT_EQ(stats().compute_wait_ms, 0.0);
}

}  // namespace
}  // namespace torch_offload
