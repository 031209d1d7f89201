// Manager on CPU tensors driven through a fake asynchronous DeviceTransfer (fake_transfer.h), with
// the copies' fences held by the test: the in-flight bound, source lifetime, synchronize,
// destroying the manager with copies pending, concurrent use, and the stream-ordered release of
// sources (finish_save, release_sources_on_save).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "manager_fixture.h"

namespace torch_offload {
namespace {

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
