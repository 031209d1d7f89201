// Manager on CPU tensors driven through a fake asynchronous DeviceTransfer (fake_transfer.h):
// round trips, in-place modification checks, the in-flight bound, source lifetime, prefetch, the
// host buffer pool, the budget, statistics and concurrent use.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "manager_fixture.h"

namespace torch_offload {
namespace {

// ---------------------------------------------------------------------------------------------
// Round trips, in every completion mode of the fake device.

class ManagerRoundTripTest : public ManagerTest, public ::testing::WithParamInterface<Completion> {
 protected:
  // max_in_flight=8: in kManual mode a save beyond the bound would wait for a fence that only a
  // later restore completes; no test here holds more than 8 unrestored saves.
  void SetUp() override { make(make_config(8, 1, 0), GetParam()); }
};

TEST_P(ManagerRoundTripTest, DtypesRoundTrip) {
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kBFloat16, at::kLong, at::kBool,
                                              at::kHalf,  at::kDouble,   at::kByte, at::kInt};
  int64_t seed = 0;
  for (at::ScalarType dtype : dtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    at::Tensor x = make_tensor({37, 11}, dtype, seed++);
    at::Tensor expected = x.clone();
    at::Tensor h = save(x);
    EXPECT_TRUE(h.is_cpu());
    EXPECT_EQ(h.scalar_type(), dtype);
    EXPECT_EQ(h.sizes(), x.sizes());
    at::Tensor y = restore(h);
    EXPECT_EQ(y.scalar_type(), dtype);
    EXPECT_EQ(y.sizes(), x.sizes());
    EXPECT_TRUE(at::equal(y, expected));
    EXPECT_NE(y.data_ptr(), h.data_ptr()) << "the restored tensor must not alias the handle";
  }
}

TEST_P(ManagerRoundTripTest, ScalarAndOneElementTensorsRoundTrip) {
  at::Tensor scalar = at::scalar_tensor(3.5, at::kFloat);
  at::Tensor one = at::full({1}, 7, at::kLong);
  at::Tensor hs = save(scalar);
  at::Tensor ho = save(one);
  at::Tensor ys = restore(hs);
  at::Tensor yo = restore(ho);
  EXPECT_EQ(ys.dim(), 0);
  EXPECT_TRUE(at::equal(ys, scalar));
  EXPECT_TRUE(at::equal(yo, one));
}

TEST_P(ManagerRoundTripTest, NonContiguousInputRoundTrips) {
  at::Tensor base = make_tensor({24, 40}, at::kFloat, 3);
  at::Tensor t = base.t();
  ASSERT_FALSE(t.is_contiguous());
  at::Tensor sliced = base.slice(1, 3, 40, 4);  // strided columns
  at::Tensor h1 = save(t);
  at::Tensor h2 = save(sliced);
  EXPECT_EQ(h1.sizes(), t.sizes());
  at::Tensor y2 = restore(h2);
  at::Tensor y1 = restore(h1);
  EXPECT_TRUE(at::equal(y1, t));
  EXPECT_TRUE(at::equal(y2, sliced));
  EXPECT_EQ(stats().bytes_to_host, static_cast<int64_t>(t.nbytes() + sliced.nbytes()));
}

TEST_P(ManagerRoundTripTest, ZeroSizeTensorsRoundTrip) {
  for (auto sizes : {std::vector<int64_t>{0}, std::vector<int64_t>{3, 0, 5}}) {
    at::Tensor x = at::empty(sizes, at::kFloat);
    at::Tensor h = save(x);
    EXPECT_EQ(h.sizes(), x.sizes());
    at::Tensor y = restore(h);
    EXPECT_EQ(y.sizes(), x.sizes());
    EXPECT_EQ(y.scalar_type(), at::kFloat);
  }
  // A zero-size tensor among real ones does not disturb them.
  at::Tensor a = make_tensor({100}, at::kFloat, 1);
  at::Tensor z = at::empty({0, 4}, at::kLong);
  at::Tensor b = make_tensor({50}, at::kLong, 2);
  at::Tensor ha = save(a), hz = save(z), hb = save(b);
  EXPECT_TRUE(at::equal(restore(hb), b));
  EXPECT_EQ(restore(hz).sizes(), z.sizes());
  EXPECT_TRUE(at::equal(restore(ha), a));
}

TEST_P(ManagerRoundTripTest, RestoringAHandleTwiceGivesTheSameDataTwice) {
  at::Tensor x = make_tensor({64, 33}, at::kFloat, 5);
  at::Tensor h = save(x);
  at::Tensor y1 = restore(h);
  at::Tensor y2 = restore(h);
  EXPECT_TRUE(at::equal(y1, x));
  EXPECT_TRUE(at::equal(y2, x));
  EXPECT_NE(y1.data_ptr(), y2.data_ptr()) << "each restore returns its own tensor";
  y1.zero_();
  EXPECT_TRUE(at::equal(y2, x)) << "modifying one restore must not affect the next";
  EXPECT_TRUE(at::equal(restore(h), x));
}

TEST_P(ManagerRoundTripTest, SavingTheSameTensorTwiceGivesIndependentHandles) {
  at::Tensor x = make_tensor({128}, at::kFloat, 6);
  at::Tensor h1 = save(x);
  at::Tensor h2 = save(x);
  EXPECT_NE(h1.data_ptr(), h2.data_ptr());
  EXPECT_EQ(stats().live_handles, 2);
  EXPECT_TRUE(at::equal(restore(h2), x));
  EXPECT_TRUE(at::equal(restore(h1), x));
}

TEST_P(ManagerRoundTripTest, SourceMayBeDroppedRightAfterSave) {
  std::vector<at::Tensor> handles, expected;
  for (int i = 0; i < 6; ++i) {
    at::Tensor x = make_tensor({1000 + i}, at::kFloat, i);
    expected.push_back(x.clone());
    handles.push_back(save(x));
  }  // every source is gone here; the manager keeps each until its copy is done
  for (int i = 5; i >= 0; --i) EXPECT_TRUE(at::equal(restore(handles[i]), expected[i])) << i;
}

INSTANTIATE_TEST_SUITE_P(AllCompletionModes, ManagerRoundTripTest,
                         ::testing::Values(Completion::kImmediate, Completion::kManual,
                                           Completion::kBackground),
                         [](const ::testing::TestParamInfo<Completion>& info) {
                           return std::string(testing::completion_name(info.param));
                         });

// ---------------------------------------------------------------------------------------------
// In-place modification after save.

TEST_F(ManagerTest, InPlaceModificationAfterSaveMakesRestoreThrow) {
  make(ManagerConfig{});
  at::Tensor x = make_tensor({16, 16}, at::kFloat, 1);
  at::Tensor h = save(x);
  x.add_(1);
  const std::string message = error_of([&] { restore(h); });
  EXPECT_NE(message.find("modified in place"), std::string::npos) << message;
}

TEST_F(ManagerTest, InPlaceModificationUnderNoGradMakesRestoreThrow) {
  make(ManagerConfig{});
  at::Tensor x = make_tensor({16, 16}, at::kFloat, 1);
  at::Tensor h;
  {
    at::NoGradGuard no_grad;
    h = save(x);
    x.mul_(2);
  }
  const std::string message = error_of([&] { restore(h); });
  EXPECT_NE(message.find("modified in place"), std::string::npos) << message;
}

TEST_F(ManagerTest, InPlaceModificationThroughAViewMakesRestoreThrow) {
  make(ManagerConfig{});
  at::Tensor base = make_tensor({8, 8}, at::kFloat, 1);
  at::Tensor h = save(base.t());  // saved a view: the view and its base share a version counter
  base.view({-1}).narrow(0, 0, 3).fill_(0);
  const std::string message = error_of([&] { restore(h); });
  EXPECT_NE(message.find("modified in place"), std::string::npos) << message;
}

TEST_F(ManagerTest, ModificationBeforeSaveAndOutOfPlaceOpsAreFine) {
  make(ManagerConfig{});
  at::Tensor x = make_tensor({32}, at::kFloat, 1);
  x.add_(1);  // before save: irrelevant
  at::Tensor h = save(x);
  at::Tensor unrelated = x + 1;  // out of place: x untouched
  (void)unrelated;
  EXPECT_TRUE(at::equal(restore(h), x));
}

// ---------------------------------------------------------------------------------------------
// Restoring tensors that are not live handles.

TEST_F(ManagerTest, RestoringATensorThatIsNotALiveHandleReturnsAPlainCopy) {
  make(ManagerConfig{});
  at::Tensor plain = make_tensor({5, 7}, at::kFloat, 2);
  at::Tensor y = restore(plain);
  EXPECT_TRUE(at::equal(y, plain));
  EXPECT_NE(y.data_ptr(), plain.data_ptr()) << "a copy, not the input itself";

  // A copy of a handle and a reshaped view of one are not handles either.
  at::Tensor x = make_tensor({6, 10}, at::kFloat, 3);
  at::Tensor h = save(x);
  at::Tensor copy = h.clone();
  EXPECT_TRUE(at::equal(restore(copy), x));
  at::Tensor reshaped = h.view({10, 6});
  EXPECT_TRUE(at::equal(restore(reshaped), x.view({10, 6})));
  at::Tensor row = h[2];
  EXPECT_TRUE(at::equal(restore(row), x[2]));
  at::Tensor reinterpreted = h.view(at::kInt);
  EXPECT_TRUE(at::equal(restore(reinterpreted), x.view(at::kInt)));
  EXPECT_TRUE(at::equal(restore(h), x));
  EXPECT_EQ(transfer_->count(Kind::kToDevice), 1) << "only the real handle goes through the "
                                                     "transfer";
}

// Regression test. A view of a handle with the same data pointer, sizes and dtype as the handle
// but other strides (the transpose of a square handle) used to be taken for the handle itself by
// Manager::restore's live-handle lookup, which returned the handle's values instead of the view's.
// This test failed against csrc/manager.cpp before commit 7396009, which now also compares strides
// and the storage offset.
TEST_F(ManagerTest, RestoringATransposedViewOfASquareHandleReturnsTheViewsValues) {
  make(ManagerConfig{});
  at::Tensor x = make_tensor({4, 4}, at::kFloat, 4);
  at::Tensor h = save(x);
  at::Tensor ht = h.t();  // same data_ptr, sizes and dtype as h; different strides
  at::Tensor y = restore(ht);
  EXPECT_TRUE(at::equal(y, x.t())) << "restore(h.t()) returned\n" << y << "\nexpected\n" << x.t();
  EXPECT_TRUE(at::equal(restore(h), x));
}

// ---------------------------------------------------------------------------------------------
// The in-flight bound and source lifetime (fences held by the test).

TEST_F(ManagerTest, SaveBlocksWhileMaxInFlightCopiesArePending) {
  make(make_config(2, 1, 0), Completion::kManual);
  at::Tensor a = make_tensor({256}, at::kFloat, 1);
  at::Tensor b = make_tensor({256}, at::kFloat, 2);
  at::Tensor c = make_tensor({256}, at::kFloat, 3);
  at::Tensor ha = save(a);
  at::Tensor hb = save(b);
  ASSERT_EQ(transfer_->count(Kind::kToHost), 2);

  std::atomic<bool> returned{false};
  auto third = std::async(std::launch::async, [&] {
    at::Tensor h = save(c);
    returned = true;
    return h;
  });
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(returned) << "a third save went ahead with 2 copies in flight and max_in_flight=2";
  EXPECT_EQ(transfer_->count(Kind::kToHost), 2) << "the third copy must not even be queued";

  transfer_->fences(Kind::kToHost)[0]->complete();  // a's copy finishes
  ASSERT_TRUE(finishes_within(third));
  at::Tensor hc = third.get();
  EXPECT_EQ(transfer_->count(Kind::kToHost), 3);

  const OffloadStats s = stats();
  EXPECT_EQ(s.in_flight_peak, 2);
  EXPECT_GT(s.host_wait_ms, 0.0) << "the time the host was blocked is reported";
  EXPECT_EQ(s.saves, 3);

  transfer_->complete_all();
  EXPECT_TRUE(at::equal(restore(hc), c));
  EXPECT_TRUE(at::equal(restore(hb), b));
  EXPECT_TRUE(at::equal(restore(ha), a));
}

TEST_F(ManagerTest, UnboundedInFlightNeverBlocks) {
  make(make_config(0, 1, 0), Completion::kManual);
  std::vector<at::Tensor> xs, hs;
  auto saver = std::async(std::launch::async, [&] {
    for (int i = 0; i < 10; ++i) {
      xs.push_back(make_tensor({64}, at::kFloat, i));
      hs.push_back(save(xs.back()));
    }
  });
  ASSERT_TRUE(finishes_within(saver, 5000ms)) << "max_in_flight=0 must mean unbounded";
  EXPECT_EQ(stats().in_flight_peak, 10);
  transfer_->complete_all();
  for (int i = 9; i >= 0; --i) EXPECT_TRUE(at::equal(restore(hs[i]), xs[i]));
}

TEST_F(ManagerTest, SourceIsKeptAliveUntilItsCopyFenceCompletesAndDroppedOnACallersThread) {
  make(ManagerConfig{}, Completion::kManual);
  constexpr int64_t n = 4096;
  auto freed = std::make_shared<std::atomic<bool>>(false);
  auto freed_on = std::make_shared<std::thread::id>();
  float* data = new float[n];
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(i) * 0.5f;
  at::Tensor h;
  {
    at::Tensor x = at::from_blob(
        data, {n},
        [freed, freed_on](void* p) {
          delete[] static_cast<float*>(p);
          *freed_on = std::this_thread::get_id();
          *freed = true;
        },
        at::kFloat);
    h = save(x);
  }  // the caller's last reference to the source is gone
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(*freed) << "the source was freed while its device-to-host copy was in flight";

  transfer_->fences(Kind::kToHost)[0]->complete();
  std::this_thread::sleep_for(kSettle);  // the releaser has seen the fence by now
  // Never on the releaser's thread: dropping a tensor Python handed us may take the GIL, which a
  // thread waiting for the releaser may hold (source_slot.h).
  EXPECT_FALSE(*freed) << "the releaser's thread dropped the source";
  manager_->synchronize();  // any call of the manager drops the finished sources, on its thread
  EXPECT_TRUE(*freed);
  EXPECT_EQ(*freed_on, std::this_thread::get_id());

  at::Tensor expected = at::arange(n, at::kFloat).mul_(0.5);
  EXPECT_TRUE(at::equal(restore(h), expected));
}

TEST_F(ManagerTest, SynchronizeWaitsForPendingCopies) {
  make(ManagerConfig{}, Completion::kManual);
  at::Tensor x = make_tensor({100}, at::kFloat, 1);
  at::Tensor h = save(x);
  std::atomic<bool> returned{false};
  auto syncer = std::async(std::launch::async, [&] {
    manager_->synchronize();
    returned = true;
  });
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(returned) << "synchronize() returned while a copy was pending";
  transfer_->complete_all();
  ASSERT_TRUE(finishes_within(syncer));
  // After synchronize the handle holds the bytes: they can be read directly.
  EXPECT_TRUE(at::equal(h, x));
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

TEST_F(ManagerTest, InvalidConfigIsRejected) {
  auto transfer = std::make_shared<FakeTransfer>();
  EXPECT_THROW(Manager::create(make_config(-1, 1, 0), transfer), c10::Error);
  EXPECT_THROW(Manager::create(make_config(4, -1, 0), transfer), c10::Error);
  EXPECT_THROW(Manager::create(make_config(4, 1, -1), transfer), c10::Error);
}

TEST_F(ManagerTest, UndefinedSparseAndNestedTensorsAreRejected) {
  make(ManagerConfig{});
  EXPECT_THROW(save(at::Tensor()), c10::Error);
  at::Tensor sparse = at::eye(3).to_sparse();
  EXPECT_THROW(save(sparse), c10::Error);
  // From C++ as from Python, a nested tensor is a clear error (it was an internal one).
  const at::Tensor nested =
      at::_nested_tensor_from_tensor_list({at::ones({2, 3}), at::ones({4, 3})});
  try {
    save(nested);
    ADD_FAILURE() << "a nested tensor was saved";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("got a nested tensor"), std::string::npos) << e.what();
  }
  EXPECT_EQ(stats().live_handles, 0);
  EXPECT_EQ(stats().host_bytes_in_use, 0);
}

TEST_F(ManagerTest, DestroyingTheManagerWithPendingCopiesWaitsForThem) {
  // The manager dies while copies are in flight: its destructor waits, nothing is leaked, and the
  // copies never touch freed memory (ASan checks the latter in the sanitizer build).
  auto transfer = std::make_shared<FakeTransfer>(Completion::kManual);
  std::weak_ptr<Manager> weak;
  std::promise<void> saved;
  auto worker = std::async(std::launch::async, [&] {
    auto manager = Manager::create(make_config(0, 1, 0), transfer,
                                   std::make_unique<CountingAllocator>(counters_));
    weak = manager;
    for (int i = 0; i < 3; ++i) manager->save(make_tensor({500}, at::kFloat, i));
    saved.set_value();
  });  // handles and manager dropped at the end of the lambda
  saved.get_future().wait();
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(finishes_within(worker, 0ms)) << "the manager was destroyed with copies pending";
  transfer->complete_all();
  ASSERT_TRUE(finishes_within(worker));
  EXPECT_TRUE(weak.expired());
  EXPECT_EQ(counters_->live_blocks, 0);
}

// ---------------------------------------------------------------------------------------------
// Concurrency.

void concurrent_round_trips(Manager& manager, int threads, int round_trips) {
  std::vector<std::thread> workers;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      std::uniform_int_distribution<int> count(1, 3);
      std::uniform_int_distribution<int64_t> numel(0, 20000);
      const at::ScalarType dtypes[] = {at::kFloat, at::kLong, at::kByte, at::kBFloat16};
      std::uniform_int_distribution<int> dtype(0, 3);
      for (int r = 0; r < round_trips; ++r) {
        std::vector<at::Tensor> xs, hs;
        const int n = count(rng);
        for (int i = 0; i < n; ++i) {
          xs.push_back(make_tensor({numel(rng)}, dtypes[dtype(rng)], t * 100000 + r * 10 + i));
          hs.push_back(manager.save(xs.back()));
        }
        for (int i = n; i-- > 0;) {
          if (!at::equal(manager.restore(hs[i], c10::Device(c10::kCPU)), xs[i])) failures++;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0) << "restored data differed from the saved data";
}

TEST_F(ManagerTest, ConcurrentSavesAndRestoresWithAsyncFences) {
  make(make_config(2, 1, 0), Completion::kBackground);
  concurrent_round_trips(*manager_, 4, 200);
  manager_->synchronize();
  const OffloadStats s = stats();
  EXPECT_EQ(s.live_handles, 0);
  EXPECT_EQ(s.host_bytes_in_use, 0);
  EXPECT_LE(s.in_flight_peak, 2 + 3) << "each thread may overshoot the bound by one at most";
  EXPECT_EQ(s.saves, s.restores);
}

TEST_F(ManagerTest, ConcurrentSavesAndRestoresWithImmediateFences) {
  make(make_config(4, 2, 0), Completion::kImmediate);
  concurrent_round_trips(*manager_, 4, 200);
  manager_->synchronize();
  EXPECT_EQ(stats().live_handles, 0);
  EXPECT_EQ(stats().host_bytes_in_use, 0);
}

// ---------------------------------------------------------------------------------------------
// Stream-ordered release of sources (finish_save, release_sources_on_save).

TEST_F(ManagerTest, FinishSaveReleasesTheSourceAfterAComputeStreamWait) {
  make(ManagerConfig{}, Completion::kManual);
  WatchedSource source(1024);
  at::Tensor h = save(source.tensor());
  EXPECT_FALSE(*source.freed) << "copy still in flight: the source must be held";
  manager_->finish_save(h);
  EXPECT_TRUE(*source.freed) << "finish_save must release the source at once";
  auto waits = transfer_->calls(Kind::kComputeWait);
  ASSERT_EQ(waits.size(), 1u) << "the release must be ordered after the copy on the compute stream";
  EXPECT_EQ(waits[0].fence, transfer_->fences(Kind::kToHost)[0]);
  transfer_->complete_all();
  EXPECT_TRUE(at::equal(restore(h), source.expected()));
  manager_->finish_save(h);                                    // nothing held any more: a no-op
  EXPECT_EQ(transfer_->calls(Kind::kComputeWait).size(), 2u);  // the restore's wait only
}

TEST_F(ManagerTest, ReleaseSourcesOnSaveReleasesEarlierSourcesOnly) {
  ManagerConfig config = make_config(0);
  config.release_sources_on_save = true;
  make(config, Completion::kManual);
  WatchedSource a(512), b(512);
  at::Tensor ha = save(a.tensor());
  EXPECT_FALSE(*a.freed);
  at::Tensor hb = save(b.tensor());
  EXPECT_TRUE(*a.freed) << "the second save releases the first source (stream-ordered)";
  EXPECT_FALSE(*b.freed) << "the source being saved stays until its own copy is done";
  ASSERT_EQ(transfer_->calls(Kind::kComputeWait).size(), 1u);
  EXPECT_EQ(transfer_->calls(Kind::kComputeWait)[0].fence, transfer_->fences(Kind::kToHost)[0]);
  transfer_->complete_all();
  EXPECT_TRUE(at::equal(restore(hb), b.expected()));
  EXPECT_TRUE(at::equal(restore(ha), a.expected()));
}

}  // namespace
}  // namespace torch_offload
