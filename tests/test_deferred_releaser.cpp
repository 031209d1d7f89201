// DeferredReleaser: payloads run only after their fences, the in-flight count and its bound,
// drain() and the destructor; a thread the system cannot start, and the Manager that owns it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "csrc/deferred_releaser.h"
#include "csrc/fault_injection.h"
#include "csrc/manager.h"
#include "fake_transfer.h"
#include "test_util.h"

namespace torch_offload {
namespace {

using namespace std::chrono_literals;
using testing::error_of;
using testing::finishes_within;
using testing::kSettle;

// A fence the test opens: the releaser's fence function blocks until open() is called.
class Gate {
 public:
  DeferredReleaser::Fence fence() const {
    auto future = future_;
    return [future] { future.wait(); };
  }
  void open() { promise_.set_value(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
};

DeferredReleaser::Fence open_fence() {
  return [] {};
}

TEST(DeferredReleaserTest, PayloadRunsOnlyAfterItsFenceReturns) {
  DeferredReleaser releaser;
  Gate gate;
  std::atomic<bool> ran{false};
  releaser.release_after(
      gate.fence(), [&] { ran = true; }, 1);
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(ran) << "payload ran before its fence completed";
  gate.open();
  releaser.drain();
  EXPECT_TRUE(ran);
}

TEST(DeferredReleaserTest, PayloadCapturesAreDestroyedOnceReleased) {
  // What the manager relies on: memory captured by a payload (a GPU source, a host buffer) is
  // actually let go, not just "processed", by the time drain() returns.
  DeferredReleaser releaser;
  Gate gate;
  auto resource = std::make_shared<int>(42);
  std::weak_ptr<int> weak = resource;
  releaser.release_after(
      gate.fence(), [resource] {}, 1);
  resource.reset();
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(weak.expired());
  gate.open();
  releaser.drain();
  EXPECT_TRUE(weak.expired());
}

TEST(DeferredReleaserTest, CapturesMayQueueMoreWorkWhenDestroyed) {
  // A payload's captures are tensors whose deleters may hand more work to the same releaser (a
  // handle freed by a payload returns its buffer through release_after): destroying them must not
  // happen under the releaser's lock.
  auto releaser = std::make_unique<DeferredReleaser>();
  auto second_ran = std::make_shared<std::atomic<bool>>(false);
  struct Requeue {
    DeferredReleaser* releaser;
    std::shared_ptr<std::atomic<bool>> ran;
    ~Requeue() {
      auto flag = ran;
      releaser->release_after([] {}, [flag] { *flag = true; }, 0);
    }
  };
  std::shared_ptr<Requeue> capture(new Requeue{releaser.get(), second_ran});
  releaser->release_after([] {}, [capture] {}, 1);
  capture.reset();
  auto drained = std::async(std::launch::async, [&] {
    releaser->drain();
    releaser->drain();  // the work queued by the destructor
  });
  if (!finishes_within(drained)) {
    ADD_FAILURE() << "the releaser deadlocked when a capture queued work from its destructor";
    // Leave the stuck threads alone rather than hang in the releaser's or the future's destructor.
    (void)releaser.release();
    (void)new std::future<void>(std::move(drained));
    return;
  }
  EXPECT_TRUE(*second_ran);
}

TEST(DeferredReleaserTest, InFlightCountsOnlyCountedItems) {
  DeferredReleaser releaser;
  Gate g1, g2, g3;
  releaser.release_after(
      g1.fence(), [] {}, 1);
  releaser.release_after(
      g2.fence(), [] {}, 0);
  releaser.release_after(
      g3.fence(), [] {}, 1);
  EXPECT_EQ(releaser.in_flight(), 2);
  EXPECT_EQ(releaser.in_flight_peak(), 2);
  g1.open();
  g2.open();
  g3.open();
  releaser.drain();
  EXPECT_EQ(releaser.in_flight(), 0);
  EXPECT_EQ(releaser.in_flight_peak(), 2);
}

TEST(DeferredReleaserTest, ABatchCountsAsItsCopies) {
  DeferredReleaser releaser;
  Gate batch, single;
  releaser.release_after(
      batch.fence(), [] {}, 3);  // three copies sharing one fence
  releaser.release_after(
      single.fence(), [] {}, 1);
  EXPECT_EQ(releaser.in_flight(), 4);
  EXPECT_EQ(releaser.in_flight_peak(), 4);
  batch.open();
  EXPECT_LT(releaser.wait_in_flight_below(2), 60000.0);  // returns once the batch is released
  EXPECT_EQ(releaser.in_flight(), 1);
  single.open();
  releaser.drain();
  EXPECT_EQ(releaser.in_flight(), 0);
}

TEST(DeferredReleaserTest, WaitInFlightBelowBlocksUntilAFenceIsReleased) {
  DeferredReleaser releaser;
  Gate g1, g2;
  std::atomic<int> released{0};
  releaser.release_after(
      g1.fence(), [&] { released++; }, 1);
  releaser.release_after(
      g2.fence(), [&] { released++; }, 1);
  ASSERT_EQ(releaser.in_flight(), 2);

  // Below the limit: returns at once.
  EXPECT_EQ(releaser.wait_in_flight_below(3), 0.0);
  EXPECT_EQ(releaser.wait_in_flight_below(0), 0.0) << "0 means unbounded";

  std::atomic<bool> returned{false};
  auto waiter = std::async(std::launch::async, [&] {
    const double ms = releaser.wait_in_flight_below(2);
    returned = true;
    return ms;
  });
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(returned) << "wait_in_flight_below(2) returned with 2 copies in flight";

  g1.open();
  ASSERT_TRUE(finishes_within(waiter));
  const double waited_ms = waiter.get();
  EXPECT_GE(released.load(), 1);
  EXPECT_LT(releaser.in_flight(), 2);
  EXPECT_GT(waited_ms, 0.0) << "the time spent blocked is reported";

  g2.open();
  releaser.drain();
}

TEST(DeferredReleaserTest, UncountedItemsDoNotBlockTheBound) {
  DeferredReleaser releaser;
  Gate g;
  releaser.release_after(
      g.fence(), [] {}, 0);
  releaser.release_after(
      g.fence(), [] {}, 0);
  auto waiter = std::async(std::launch::async, [&] { return releaser.wait_in_flight_below(1); });
  EXPECT_TRUE(finishes_within(waiter, 2000ms));
  g.open();
  releaser.drain();
}

TEST(DeferredReleaserTest, DrainBlocksUntilEveryItemIsReleased) {
  DeferredReleaser releaser;
  Gate g1, g2;
  std::atomic<int> ran{0};
  releaser.release_after(
      g1.fence(), [&] { ran++; }, 1);
  releaser.release_after(
      g2.fence(), [&] { ran++; }, 0);
  std::atomic<bool> returned{false};
  auto drainer = std::async(std::launch::async, [&] {
    releaser.drain();
    returned = true;
  });
  g1.open();
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(returned) << "drain() returned while an item was pending";
  g2.open();
  ASSERT_TRUE(finishes_within(drainer));
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(releaser.in_flight(), 0);
}

TEST(DeferredReleaserTest, DrainOnIdleReleaserReturnsImmediately) {
  DeferredReleaser releaser;
  auto drainer = std::async(std::launch::async, [&] { releaser.drain(); });
  EXPECT_TRUE(finishes_within(drainer, 2000ms));
}

TEST(DeferredReleaserTest, DestructorWaitsForFencesAndRunsEveryPayload) {
  std::atomic<int> ran{0};
  Gate gate;
  auto resource = std::make_shared<int>(1);
  std::weak_ptr<int> weak = resource;
  std::thread opener;
  {
    DeferredReleaser releaser;
    releaser.release_after(
        gate.fence(), [&] { ran++; }, 1);
    for (int i = 0; i < 5; ++i) {
      releaser.release_after(
          open_fence(), [&, resource] { ran++; }, i % 2 == 0);
    }
    resource.reset();
    opener = std::thread([&] {
      std::this_thread::sleep_for(kSettle);
      gate.open();
    });
  }  // ~DeferredReleaser blocks until the gate opens
  EXPECT_EQ(ran.load(), 6);
  EXPECT_TRUE(weak.expired());
  opener.join();
}

TEST(DeferredReleaserTest, InFlightPeakAndReset) {
  DeferredReleaser releaser;
  std::vector<Gate> gates(3);
  for (auto& g : gates)
    releaser.release_after(
        g.fence(), [] {}, 1);
  EXPECT_EQ(releaser.in_flight_peak(), 3);
  for (auto& g : gates) g.open();
  releaser.drain();
  EXPECT_EQ(releaser.in_flight(), 0);
  EXPECT_EQ(releaser.in_flight_peak(), 3) << "the peak survives the items";
  releaser.reset_peak();
  EXPECT_EQ(releaser.in_flight_peak(), 0);

  Gate g;
  releaser.release_after(
      g.fence(), [] {}, 1);
  EXPECT_EQ(releaser.in_flight_peak(), 1);
  g.open();
  releaser.drain();
}

TEST(DeferredReleaserTest, ManyProducersAllPayloadsRun) {
  DeferredReleaser releaser;
  std::atomic<int> ran{0};
  std::vector<std::thread> producers;
  for (int t = 0; t < 4; ++t) {
    producers.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        releaser.wait_in_flight_below(8);
        releaser.release_after(
            open_fence(), [&] { ran++; }, i % 3 != 0);
      }
    });
  }
  for (auto& p : producers) p.join();
  releaser.drain();
  EXPECT_EQ(ran.load(), 2000);
  EXPECT_EQ(releaser.in_flight(), 0);
  EXPECT_LE(releaser.in_flight_peak(), 8 + 3) << "each producer can overshoot by one at most";
}

// A thread the system refuses (a process or container at its limit of threads) used to surface as
// the bare "Resource temporarily unavailable" of std::thread. The error names the thread, keeps the
// system's reason and says what to do.
void expect_clear_thread_error(const std::string& message) {
  for (const char* part :
       {"torch_offload: cannot start the offload manager's releaser thread",
        "Resource temporarily unavailable", "limit of threads", "this process runs", "ulimit -u"}) {
    EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
  }
}

class ReleaserThreadStartTest : public ::testing::Test {
 protected:
  void TearDown() override { clear_injected_faults(); }
};

TEST_F(ReleaserThreadStartTest, AThreadThatCannotStartIsAClearError) {
  inject_fault(FaultSite::kReleaserThreadStart, /*skip=*/0, /*times=*/1);
  expect_clear_thread_error(error_of([] { DeferredReleaser releaser; }));
  // Once the system starts threads again, so does a releaser.
  DeferredReleaser releaser;
  std::atomic<bool> ran{false};
  releaser.release_after(
      open_fence(), [&] { ran = true; }, 0);
  releaser.drain();
  EXPECT_TRUE(ran.load());
}

TEST_F(ReleaserThreadStartTest, AManagerWhoseReleaserCannotStartIsAClearErrorAndNoManager) {
  inject_fault(FaultSite::kReleaserThreadStart, /*skip=*/0, /*times=*/1);
  expect_clear_thread_error(error_of(
      [] { Manager::create(ManagerConfig{}, std::make_shared<testing::FakeTransfer>()); }));
  auto manager = Manager::create(ManagerConfig{}, std::make_shared<testing::FakeTransfer>());
  const at::Tensor x = at::arange(16, at::kFloat);
  const at::Tensor h = manager->save(x);
  EXPECT_TRUE(at::equal(manager->restore(h, testing::kCPU), x));
}

}  // namespace
}  // namespace torch_offload
