// The window of saves kept on the device (ManagerConfig::keep_on_device_bytes), on CPU tensors
// through the fake asynchronous transfer: what is kept is never copied and restores from its own
// memory, what the window pushes out is copied like any other save, and every other path (views of
// a kept handle, in-place checks, handles dying early, prefetch) stays correct. Then the window's
// own bookkeeping (DeviceWindow) on its own.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "csrc/device_window.h"
#include "manager_fixture.h"

namespace torch_offload {
namespace {

ManagerConfig window_config(int64_t keep_on_device_bytes, int64_t prefetch_depth = 1) {
  ManagerConfig config = make_config(8, prefetch_depth, 0);
  config.keep_on_device_bytes = keep_on_device_bytes;
  return config;
}

TEST_F(ManagerTest, TheNewestSavesStayOnTheDeviceAndTheOldestAreCopied) {
  make(window_config(1200), Completion::kManual);  // room for three tensors of 400 bytes
  std::vector<at::Tensor> xs, hs;
  for (int i = 0; i < 5; ++i) {
    xs.push_back(make_tensor({100}, at::kFloat, i));
    hs.push_back(save(xs.back()));
  }
  auto to_host = transfer_->calls(Kind::kToHost);
  ASSERT_EQ(to_host.size(), 2u) << "the two oldest saves were pushed out of the window";
  EXPECT_EQ(to_host[0].host_ptr, hs[0].data_ptr());
  EXPECT_EQ(to_host[1].host_ptr, hs[1].data_ptr());
  OffloadStats s = stats();
  EXPECT_EQ(s.saves, 5);
  EXPECT_EQ(s.bytes_to_host, 800) << "only what was copied";
  EXPECT_EQ(s.window_bytes, 1200);

  // Backward order: the kept ones are served by their own memory, without a copy.
  for (int i = 4; i >= 2; --i) {
    const at::Tensor out = restore(hs[i]);
    EXPECT_TRUE(at::equal(out, xs[i])) << i;
    EXPECT_EQ(out.data_ptr(), xs[i].data_ptr()) << i;
  }
  s = stats();
  EXPECT_EQ(s.restores_kept_on_device, 3);
  EXPECT_EQ(s.bytes_kept_on_device, 1200);
  EXPECT_EQ(s.window_bytes, 0) << "restored entries leave the window";
  // The first restore started the prefetch of the newest copied entry (kept ones are skipped).
  auto to_device = transfer_->calls(Kind::kToDevice);
  ASSERT_EQ(to_device.size(), 1u);
  EXPECT_EQ(to_device[0].host_ptr, hs[1].data_ptr());
  EXPECT_EQ(to_device[0].ready, to_host[1].fence) << "queued after its own copy to the host";

  transfer_->complete_all();
  EXPECT_TRUE(at::equal(restore(hs[1]), xs[1]));
  EXPECT_TRUE(at::equal(restore(hs[0]), xs[0]));
  EXPECT_EQ(stats().prefetch_hits, 2);
}

TEST_F(ManagerTest, AKeptRestoreIsANewTensorWithoutHistoryOnTheSourcesMemory) {
  make(window_config(1 << 20));
  at::Tensor x = make_tensor({4, 25}, at::kFloat, 1).requires_grad_();
  at::Tensor y = x.mul(2);  // a non-leaf with autograd history, as saved activations are
  at::Tensor h = save(y);
  const at::Tensor out = restore(h);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_FALSE(out.is_same(y));
  EXPECT_EQ(out.data_ptr(), y.data_ptr());
  EXPECT_EQ(out.sizes(), y.sizes());
  EXPECT_TRUE(at::equal(out, y.detach()));
  EXPECT_EQ(transfer_->count(Kind::kToHost), 0);
  EXPECT_EQ(transfer_->count(Kind::kToDevice), 0);
}

TEST_F(ManagerTest, AKeptHandleRestoresAsOftenAsAsked) {
  // retain_graph: backward runs twice over the same saved tensors.
  make(window_config(1 << 20));
  at::Tensor x = make_tensor({50}, at::kFloat, 2);
  at::Tensor h = save(x);
  EXPECT_TRUE(at::equal(restore(h), x));
  EXPECT_TRUE(at::equal(restore(h), x));
  EXPECT_EQ(stats().restores_kept_on_device, 2);
  EXPECT_EQ(transfer_->count(Kind::kToHost), 0);
}

TEST_F(ManagerTest, InPlaceModificationOfAKeptSourceMakesRestoreThrow) {
  make(window_config(1 << 20));
  at::Tensor x = make_tensor({50}, at::kFloat, 3);
  at::Tensor h = save(x);
  x.add_(1);
  const std::string error = error_of([&] { restore(h); });
  EXPECT_NE(error.find("modified in place"), std::string::npos) << error;
}

TEST_F(ManagerTest, AViewOfAKeptHandleIsCopiedOutFirst) {
  // A restore of a transposed view of a handle reads its host bytes: a kept entry's are written
  // only then.
  make(window_config(1 << 20));
  at::Tensor x = make_tensor({6, 6}, at::kFloat, 4);
  at::Tensor h = save(x);
  EXPECT_EQ(transfer_->count(Kind::kToHost), 0);
  const at::Tensor transposed = manager_->restore(h.t(), kCPU);
  EXPECT_EQ(transfer_->count(Kind::kToHost), 1);
  EXPECT_TRUE(at::equal(transposed, x.t()));
  EXPECT_EQ(stats().window_bytes, 0);
  EXPECT_EQ(stats().bytes_to_host, 144);
  EXPECT_TRUE(at::equal(restore(h), x)) << "the handle itself now restores from host memory";
  EXPECT_EQ(stats().restores_kept_on_device, 0);
}

TEST_F(ManagerTest, AHandleDyingInTheWindowReleasesItsSourceAndItsPlace) {
  make(window_config(1 << 20));
  WatchedSource source(100);
  {
    at::Tensor h = save(source.tensor());
    EXPECT_FALSE(*source.freed) << "kept: the manager holds the source";
    EXPECT_EQ(stats().window_bytes, 400);
  }
  EXPECT_TRUE(*source.freed);
  EXPECT_EQ(stats().window_bytes, 0);
  EXPECT_EQ(transfer_->count(Kind::kToHost), 0) << "never needed on the host";
}

TEST_F(ManagerTest, ARestoredKeptSourceIsHeldUntilItsHandleDies) {
  make(window_config(1 << 20));
  WatchedSource source(100);
  at::Tensor h = save(source.tensor());
  { const at::Tensor out = restore(h); }
  EXPECT_FALSE(*source.freed) << "a later restore (retain_graph) reads it again";
  h = at::Tensor();
  EXPECT_TRUE(*source.freed);
}

TEST_F(ManagerTest, APushedOutSourceIsReleasedAfterItsCopy) {
  make(window_config(400), Completion::kManual);
  WatchedSource first(100), second(100);
  at::Tensor h1 = save(first.tensor());
  at::Tensor h2 = save(second.tensor());  // pushes the first out: its copy starts
  ASSERT_EQ(transfer_->count(Kind::kToHost), 1);
  EXPECT_FALSE(*first.freed) << "its copy is in flight";
  transfer_->complete_all();
  EXPECT_TRUE(eventually([&] { return stats().live_handles == 2 && *first.freed; }));
  EXPECT_FALSE(*second.freed) << "still kept";
  EXPECT_TRUE(at::equal(restore(h2), second.expected()));
  EXPECT_TRUE(at::equal(restore(h1), first.expected()));
}

TEST_F(ManagerTest, TensorsLargerThanTheWindowAreCopiedAsUsual) {
  make(window_config(100));
  at::Tensor x = make_tensor({50}, at::kFloat, 5);  // 200 bytes
  at::Tensor h = save(x);
  EXPECT_EQ(transfer_->count(Kind::kToHost), 1);
  EXPECT_EQ(stats().window_bytes, 0);
  EXPECT_TRUE(at::equal(restore(h), x));
  EXPECT_EQ(stats().restores_kept_on_device, 0);
}

TEST_F(ManagerTest, TheWindowCanBeResizedBetweenSteps) {
  make(make_config(8, 1, 0), Completion::kManual);  // no window to start with
  EXPECT_EQ(manager_->keep_on_device_bytes(), 0);
  manager_->set_keep_on_device_bytes(1200);
  std::vector<at::Tensor> xs, hs;
  for (int i = 0; i < 3; ++i) {
    xs.push_back(make_tensor({100}, at::kFloat, i));
    hs.push_back(save(xs.back()));
  }
  EXPECT_EQ(transfer_->count(Kind::kToHost), 0);
  manager_->set_keep_on_device_bytes(400);  // smaller: the two oldest are copied out at once
  auto to_host = transfer_->calls(Kind::kToHost);
  ASSERT_EQ(to_host.size(), 2u);
  EXPECT_EQ(to_host[0].host_ptr, hs[0].data_ptr());
  EXPECT_EQ(to_host[1].host_ptr, hs[1].data_ptr());
  EXPECT_EQ(stats().window_bytes, 400);
  manager_->set_keep_on_device_bytes(0);
  EXPECT_EQ(transfer_->count(Kind::kToHost), 3);
  EXPECT_EQ(stats().window_bytes, 0);
  transfer_->complete_all();
  for (int i = 2; i >= 0; --i) EXPECT_TRUE(at::equal(restore(hs[i]), xs[i])) << i;
  EXPECT_EQ(stats().restores_kept_on_device, 0);
}

TEST_F(ManagerTest, KeepOnDeviceIsRefusedWithSynchronousCopiesAndWithADiskTier) {
  auto transfer = std::make_shared<FakeTransfer>();
  ManagerConfig negative = window_config(-1);
  EXPECT_THROW(Manager::create(negative, transfer), c10::Error);
  ManagerConfig synchronous = window_config(1024);
  synchronous.synchronous = true;
  std::string error = error_of([&] { Manager::create(synchronous, transfer); });
  EXPECT_NE(error.find("synchronous=True"), std::string::npos) << error;
  testing::TempDir dir;
  ManagerConfig disk = window_config(1024);
  disk.disk_dir = dir.path();
  error = error_of([&] { Manager::create(disk, transfer); });
  EXPECT_NE(error.find("disk_dir"), std::string::npos) << error;
  synchronous.keep_on_device_bytes = 0;  // also when set later
  auto manager = Manager::create(synchronous, transfer);
  error = error_of([&] { manager->set_keep_on_device_bytes(1024); });
  EXPECT_NE(error.find("synchronous=True"), std::string::npos) << error;
  EXPECT_THROW(manager->set_keep_on_device_bytes(-1), c10::Error);
}

// The window's own bookkeeping: its bytes follow what entered and left, the oldest key is the next
// to go, and what a save may keep depends on the limit only.
TEST(DeviceWindowTest, CountsTheBytesOfItsKeysAndGivesTheOldestFirst) {
  DeviceWindow window;
  EXPECT_FALSE(window.keeps(100, true)) << "a window of 0 bytes keeps nothing";
  window.set_limit(300);
  EXPECT_TRUE(window.keeps(300, true));
  EXPECT_FALSE(window.keeps(301, true)) << "larger than the window";
  EXPECT_FALSE(window.keeps(0, true)) << "nothing to keep";
  EXPECT_FALSE(window.keeps(100, false)) << "no transfer: copied synchronously";
  int a = 0, b = 0, c = 0;
  const DeviceWindow::Position pa = window.enter(&a, 100);
  const DeviceWindow::Position pb = window.enter(&b, 150);
  EXPECT_EQ(window.bytes(), 250);
  EXPECT_FALSE(window.over_limit());
  const DeviceWindow::Position pc = window.enter(&c, 100);
  EXPECT_TRUE(window.over_limit());
  EXPECT_EQ(window.oldest(), &a);
  window.leave(pa);
  EXPECT_FALSE(window.over_limit());
  EXPECT_EQ(window.oldest(), &b);
  window.leave(pc);  // a newer key leaves first (restored, or its handle died)
  EXPECT_EQ(window.bytes(), 150);
  EXPECT_EQ(window.oldest(), &b);
  window.leave(pb);
  EXPECT_EQ(window.bytes(), 0);
}

}  // namespace
}  // namespace torch_offload
