// Manager's batches of device-to-host copies (Manager::begin_batch, copy_batch.h), on CPU
// tensors driven through the fake asynchronous transfer: saves queue their copies until the batch
// ends, one fence serves the batch, anything that uses a pending copy issues it first, and nothing
// is lost when a handle dies, the batch fills, another thread saves or the issue fails. Then the
// batch's own state (CopyBatch) on its own.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "csrc/copy_batch.h"
#include "manager_fixture.h"

namespace torch_offload {
namespace {

using BatchTest = ManagerTest;

std::vector<at::Tensor> tensors(int n) {
  std::vector<at::Tensor> xs;
  for (int i = 0; i < n; ++i) xs.push_back(make_tensor({64 + i}, at::kFloat, i));
  return xs;
}

TEST_F(BatchTest, ABatchIsIssuedAtItsEndWithOneFence) {
  make(make_config(4, 1, 0));
  const std::vector<at::Tensor> xs = tensors(3);
  std::vector<at::Tensor> hs;
  manager_->begin_batch();
  for (const auto& x : xs) hs.push_back(save(x));
  EXPECT_EQ(transfer_->count(Kind::kToHost), 0) << "queued, not issued, inside the batch";
  manager_->end_batch();
  const auto calls = transfer_->calls(Kind::kToHost);
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(transfer_->batches(), 1);
  EXPECT_EQ(calls[0].fence, calls[2].fence) << "one fence for the batch";
  for (int i = 2; i >= 0; --i) EXPECT_TRUE(at::equal(restore(hs[i]), xs[i])) << i;
  const OffloadStats s = stats();
  EXPECT_EQ(s.batched_copies, 3);
  EXPECT_EQ(s.copy_batches, 1);
  EXPECT_EQ(s.bytes_to_host, (64 + 65 + 66) * 4);
}

TEST_F(BatchTest, BatchesNestAndOnlyTheOutermostEndIssues) {
  make(make_config(4, 1, 0));
  const std::vector<at::Tensor> xs = tensors(2);
  manager_->begin_batch();
  const at::Tensor h0 = save(xs[0]);
  manager_->begin_batch();
  const at::Tensor h1 = save(xs[1]);
  manager_->end_batch();
  EXPECT_EQ(transfer_->count(Kind::kToHost), 0);
  manager_->end_batch();
  EXPECT_EQ(transfer_->batches(), 1);
  EXPECT_TRUE(at::equal(restore(h1), xs[1]));
  EXPECT_TRUE(at::equal(restore(h0), xs[0]));
  manager_->end_batch();  // unmatched: nothing to end
}

TEST_F(BatchTest, ARestoreInsideTheBatchIssuesItFirst) {
  make(make_config(4, 1, 0), Completion::kManual);
  const std::vector<at::Tensor> xs = tensors(2);
  manager_->begin_batch();
  const at::Tensor h0 = save(xs[0]);
  const at::Tensor h1 = save(xs[1]);
  transfer_->complete_all();  // nothing issued yet, nothing to complete
  EXPECT_EQ(transfer_->batches(), 0);
  at::Tensor restored;
  std::thread restorer([&] { restored = restore(h1); });  // waits for the copy, once issued
  std::this_thread::sleep_for(kSettle);
  transfer_->complete_all();
  restorer.join();
  EXPECT_EQ(transfer_->batches(), 1);
  EXPECT_TRUE(at::equal(restored, xs[1]));
  manager_->end_batch();  // nothing left: no second batch
  EXPECT_EQ(transfer_->batches(), 1);
  transfer_->complete_all();
  EXPECT_TRUE(at::equal(restore(h0), xs[0]));
}

TEST_F(BatchTest, AHandleDroppedWhilePendingFreesItsMemoryOnlyAfterItsCopy) {
  make(make_config(4, 1, 0), Completion::kManual);
  WatchedSource source(4096);
  manager_->begin_batch();
  at::Tensor h = save(source.tensor());
  h = at::Tensor();  // the graph is dropped before the module returns
  EXPECT_EQ(transfer_->batches(), 1) << "its copy was issued: its memory must not be reused first";
  EXPECT_GT(stats().host_bytes_in_use, 0) << "the host buffer waits for the copy into it";
  transfer_->complete_all();
  manager_->synchronize();
  EXPECT_EQ(stats().host_bytes_in_use, 0);
  EXPECT_TRUE(*source.freed);
  manager_->end_batch();
  EXPECT_EQ(transfer_->batches(), 1);
}

TEST_F(BatchTest, AFullBatchIsIssuedWithoutWaitingForItsEnd) {
  make(make_config(0, 1, 0));
  const std::vector<at::Tensor> xs = tensors(static_cast<int>(Manager::kMaxBatch) + 1);
  std::vector<at::Tensor> hs;
  manager_->begin_batch();
  for (const auto& x : xs) hs.push_back(save(x));
  EXPECT_EQ(transfer_->batches(), 1);
  EXPECT_EQ(transfer_->count(Kind::kToHost), static_cast<int>(Manager::kMaxBatch));
  manager_->end_batch();
  EXPECT_EQ(transfer_->batches(), 2);
  for (size_t i = hs.size(); i-- > 0;) EXPECT_TRUE(at::equal(restore(hs[i]), xs[i])) << i;
}

TEST_F(BatchTest, ABatchWaitsForTheInFlightBoundAndCountsAsItsCopies) {
  make(make_config(2, 1, 0), Completion::kManual);
  const std::vector<at::Tensor> xs = tensors(5);
  std::vector<at::Tensor> hs;
  manager_->begin_batch();
  for (int i = 0; i < 3; ++i) hs.push_back(save(xs[i]));
  manager_->end_batch();  // nothing in flight yet: issued at once, 3 copies for a bound of 2
  EXPECT_EQ(stats().in_flight_peak, 3);
  std::atomic<bool> issued{false};
  std::thread second([&] {
    manager_->begin_batch();
    hs.push_back(save(xs[3]));
    hs.push_back(save(xs[4]));
    manager_->end_batch();
    issued = true;
  });
  std::this_thread::sleep_for(kSettle);
  EXPECT_FALSE(issued) << "3 copies in flight, max_in_flight=2: the next batch waits";
  EXPECT_EQ(transfer_->batches(), 1);
  transfer_->complete_all();
  second.join();
  EXPECT_EQ(transfer_->batches(), 2);
  EXPECT_GT(stats().host_wait_ms, 0.0);
  transfer_->complete_all();
  for (int i = 4; i >= 0; --i) EXPECT_TRUE(at::equal(restore(hs[i]), xs[i])) << i;
}

TEST_F(BatchTest, OtherThreadsAndSynchronousManagersCopyOneByOne) {
  make(make_config(4, 1, 0));
  const std::vector<at::Tensor> xs = tensors(2);
  manager_->begin_batch();
  at::Tensor other;
  std::thread saver([&] { other = save(xs[0]); });
  saver.join();
  EXPECT_EQ(transfer_->count(Kind::kToHost), 1) << "another thread's save is not batched";
  EXPECT_EQ(transfer_->batches(), 0);
  const at::Tensor mine = save(xs[1]);
  manager_->end_batch();
  EXPECT_EQ(transfer_->batches(), 1);
  EXPECT_TRUE(at::equal(restore(mine), xs[1]));
  EXPECT_TRUE(at::equal(restore(other), xs[0]));

  ManagerConfig sync = make_config(4, 0, 0);
  sync.synchronous = true;
  make(sync);
  manager_->begin_batch();
  const at::Tensor h = save(xs[0]);
  EXPECT_EQ(transfer_->count(Kind::kToHost), 1);
  manager_->end_batch();
  EXPECT_EQ(transfer_->batches(), 0);
  EXPECT_TRUE(at::equal(restore(h), xs[0]));
}

TEST_F(BatchTest, SynchronizeIssuesThePendingCopies) {
  make(make_config(4, 1, 0));
  const at::Tensor x = make_tensor({128}, at::kFloat, 5);
  manager_->begin_batch();
  const at::Tensor h = save(x);
  manager_->synchronize();
  EXPECT_EQ(transfer_->batches(), 1);
  EXPECT_EQ(stats().in_flight_peak, 1);
  manager_->end_batch();
  EXPECT_TRUE(at::equal(restore(h), x));
}

TEST_F(BatchTest, ABatchThatCannotBeIssuedKeepsItsSourcesAndRaises) {
  make(make_config(4, 1, 0));
  const std::vector<at::Tensor> xs = tensors(2);
  manager_->begin_batch();
  const at::Tensor h0 = save(xs[0]);
  const at::Tensor h1 = save(xs[1]);
  transfer_->fail_batches(true);
  const std::string error = error_of([&] { manager_->end_batch(); });
  EXPECT_NE(error.find("could not be issued"), std::string::npos) << error;
  transfer_->fail_batches(false);
  // Served by the sources the entries kept: the right data, nothing copied.
  EXPECT_TRUE(at::equal(restore(h1), xs[1]));
  EXPECT_TRUE(at::equal(restore(h0), xs[0]));
  EXPECT_EQ(transfer_->count(Kind::kToHost), 0);
  EXPECT_EQ(stats().restores_kept_on_device, 2);
}

// The batch's own state: one batching thread, whose nested begins end at the outermost end, and
// pending copies of one producer stream, taken in save order.
TEST(CopyBatchTest, NestsOnItsThreadAndClosesAtTheOutermostEnd) {
  CopyBatch batch;
  EXPECT_FALSE(batch.open_on_this_thread());
  EXPECT_FALSE(batch.close()) << "never begun";
  batch.take_over();
  batch.nest();
  EXPECT_TRUE(batch.open_on_this_thread());
  std::thread([&] { EXPECT_FALSE(batch.open_on_this_thread()) << "another thread's"; }).join();
  EXPECT_FALSE(batch.close()) << "the nested end";
  EXPECT_TRUE(batch.open_on_this_thread());
  EXPECT_TRUE(batch.close()) << "the outermost end";
  EXPECT_FALSE(batch.open_on_this_thread());

  batch.take_over();
  std::thread([&] {
    batch.take_over();
    EXPECT_TRUE(batch.close());
  }).join();
  EXPECT_FALSE(batch.close()) << "taken over by another thread";
}

TEST(CopyBatchTest, TakesThePendingCopiesOfOneProducerInSaveOrder) {
  CopyBatch batch;
  const at::Tensor src = at::zeros({4});
  const c10::Stream producer = CopyBatch::producer_of(src);
  const c10::Stream other(c10::Stream::UNSAFE, c10::Device(c10::kCPU), producer.id() + 1);
  EXPECT_TRUE(batch.empty());
  EXPECT_TRUE(batch.accepts(other)) << "an empty batch takes any producer";
  std::vector<int> keys(CopyBatch::kMaxCopies);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_FALSE(batch.full());
    batch.add(CopyBatch::Copy{&keys[i], src, at::empty({4})}, producer);
  }
  EXPECT_TRUE(batch.full());
  EXPECT_EQ(batch.stream(), producer);
  EXPECT_TRUE(batch.accepts(producer));
  EXPECT_FALSE(batch.accepts(other)) << "one producer per batch";
  const std::vector<CopyBatch::Copy> taken = batch.take();
  ASSERT_EQ(taken.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(taken[i].key, &keys[i]);
  EXPECT_TRUE(batch.empty());
  EXPECT_TRUE(batch.accepts(other));
}

}  // namespace
}  // namespace torch_offload
