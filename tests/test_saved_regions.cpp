// SavedRegions (csrc/saved_regions.h), the deduplicated saves behind offload_pack / offload_unpack,
// on a Manager of CPU tensors driven through the fake asynchronous transfer, with a fake backward
// scope: views of one storage share one copy and come back with their own layout; a copy is
// restored once per backward and dropped after its last unpack or when the backward ends; in-place
// changes are errors; nothing outlives the save handles.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "manager_fixture.h"

namespace torch_offload {
namespace {

class SavedRegionsTest : public ManagerTest {
 protected:
  void SetUp() override {
    // The manager's own table, made with a fake backward scope (the engine's is put back after).
    const BackwardScope engine_scope = default_backward_scope();
    set_default_backward_scope(
        {[this] { return task_; }, [this](std::function<void()> f) { at_end_.push_back(f); }});
    make(make_config(8, 1, 0));
    set_default_backward_scope(engine_scope);
    regions_ = &manager_->saved_regions();
  }
  at::Tensor unpack(const at::Tensor& save) { return regions_->unpack(save, kCPU); }
  OffloadStats region_stats() const {
    OffloadStats s;
    regions_->add_stats(s);
    return s;
  }
  void end_backward() {
    for (auto& f : at_end_) f();
    at_end_.clear();
    task_ = -1;
  }

  int64_t task_ = -1;
  std::vector<std::function<void()>> at_end_;
  SavedRegions* regions_ = nullptr;
};

void expect_same_view(const at::Tensor& got, const at::Tensor& expected) {
  EXPECT_EQ(got.sizes(), expected.sizes());
  EXPECT_EQ(got.strides(), expected.strides());
  EXPECT_EQ(got.scalar_type(), expected.scalar_type());
  EXPECT_TRUE(at::equal(got, expected));
}

TEST_F(SavedRegionsTest, ATensorAndItsTransposeShareOneCopy) {
  const at::Tensor h = make_tensor({8, 6}, at::kFloat);
  const at::Tensor s1 = regions_->pack(h);
  const at::Tensor s2 = regions_->pack(h.t());
  EXPECT_EQ(stats().saves, 1);
  EXPECT_EQ(region_stats().saved_tensors, 2);
  EXPECT_EQ(region_stats().shared_saves, 1);
  EXPECT_EQ(region_stats().distinct_bytes_saved, h.nbytes());
  expect_same_view(unpack(s1), h);
  expect_same_view(unpack(s2), h.t());
}

TEST_F(SavedRegionsTest, AContiguousSliceOverHalfTheStorageThenTheRest) {
  // The first copy is widened to the whole storage: the second slice finds its rows there.
  const at::Tensor h = make_tensor({400, 16}, at::kFloat);
  const at::Tensor a = regions_->pack(h.slice(0, 0, 300));
  const at::Tensor b = regions_->pack(h.slice(0, 300, 400));
  EXPECT_EQ(stats().bytes_to_host, h.nbytes());
  expect_same_view(unpack(a), h.slice(0, 0, 300));
  expect_same_view(unpack(b), h.slice(0, 300, 400));
}

TEST_F(SavedRegionsTest, SparseAndBroadcastViewsAreCopiedCompacted) {
  const at::Tensor h = make_tensor({16, 32}, at::kFloat);
  const at::Tensor every_fourth = h.slice(1, 0, 32, 4);
  const at::Tensor row = make_tensor({1, 32}, at::kFloat, 1);
  const at::Tensor expanded = row.expand({64, 32});
  const at::Tensor s1 = regions_->pack(every_fourth);
  const at::Tensor s2 = regions_->pack(expanded);
  EXPECT_EQ(stats().bytes_to_host, every_fourth.numel() * 4 + row.nbytes());
  // A gapped view comes back compact (its gaps were never copied), a broadcast one as it was.
  EXPECT_TRUE(at::equal(unpack(s1), every_fourth));
  expect_same_view(unpack(s2), expanded);
}

TEST_F(SavedRegionsTest, ViewsAcrossDtypesComeBackInTheirOwnDtype) {
  const at::Tensor h = make_tensor({64}, at::kFloat);
  const at::Tensor as_ints = h.view(at::kInt).slice(0, 8, 40);
  const at::Tensor s1 = regions_->pack(h);
  const at::Tensor s2 = regions_->pack(as_ints);  // a view family of its own (autograd's _base)
  expect_same_view(unpack(s2), as_ints);
  expect_same_view(unpack(s1), h);
}

TEST_F(SavedRegionsTest, OneRestorePerBackwardDroppedAfterTheLastUnpack) {
  const at::Tensor h = make_tensor({32, 8}, at::kFloat);
  const at::Tensor s1 = regions_->pack(h);
  const at::Tensor s2 = regions_->pack(h.t());
  task_ = 7;
  const at::Tensor r1 = unpack(s1);
  EXPECT_EQ(regions_->held_restores(), 1);
  const at::Tensor r2 = unpack(s2);
  EXPECT_EQ(regions_->held_restores(), 0) << "held after its last save was unpacked";
  EXPECT_EQ(stats().restores, 1);
  EXPECT_EQ(r1.data_ptr(), r2.data_ptr());
  end_backward();
  // Outside a backward every unpack restores.
  unpack(s1);
  unpack(s1);
  EXPECT_EQ(stats().restores, 3);
}

TEST_F(SavedRegionsTest, ASaveSharingACopyMakesItTheNewestForPrefetch) {
  // Rotary cos / sin: saved in the first block, shared by the saves of every later block, so
  // backward unpacks them first. Prefetch follows the last save, not the first copy.
  const at::Tensor cos = make_tensor({16, 8}, at::kFloat, 1);
  const at::Tensor a = make_tensor({16, 8}, at::kFloat, 2);
  const at::Tensor b = make_tensor({16, 8}, at::kFloat, 3);
  const at::Tensor s_cos = regions_->pack(cos);
  const at::Tensor s_a = regions_->pack(a);
  const at::Tensor s_b = regions_->pack(b);
  const at::Tensor s_cos_again = regions_->pack(cos.t());
  ASSERT_EQ(region_stats().shared_saves, 1);
  manager_->prefetch_newest(kCPU, 1);
  auto to_device = transfer_->calls(Kind::kToDevice);
  ASSERT_EQ(to_device.size(), 1u);
  EXPECT_EQ(to_device[0].host_ptr, s_cos.data_ptr()) << "cos's copy, saved again last";
  task_ = 3;  // backward: the newest save first, then b, a
  expect_same_view(unpack(s_cos_again), cos.t());
  expect_same_view(unpack(s_b), b);
  expect_same_view(unpack(s_a), a);
  expect_same_view(unpack(s_cos), cos);
  EXPECT_EQ(stats().restores, 3);
  EXPECT_EQ(stats().prefetch_hits, 3) << "each restore served by a prefetch";
  end_backward();
}

TEST_F(SavedRegionsTest, TheBackwardsEndDropsWhatItsUnpacksDidNotUseUp) {
  const at::Tensor h = make_tensor({32, 8}, at::kFloat);
  const at::Tensor s1 = regions_->pack(h);
  const at::Tensor s2 = regions_->pack(h.t());  // never unpacked in this backward
  task_ = 3;
  unpack(s1);
  EXPECT_EQ(regions_->held_restores(), 1);
  end_backward();
  EXPECT_EQ(regions_->held_restores(), 0);
}

TEST_F(SavedRegionsTest, ABackwardThatFailsMidwayLeavesNoRestoreHeld) {
  // The backward's end never comes (an error midway); autograd frees the graph, so the save
  // handles die, and the restored device copy goes with them.
  {
    const at::Tensor h = make_tensor({32, 8}, at::kFloat);
    const at::Tensor s1 = regions_->pack(h);
    const at::Tensor s2 = regions_->pack(h.t());
    task_ = 5;
    unpack(s1);
    EXPECT_EQ(regions_->held_restores(), 1);
  }
  EXPECT_EQ(regions_->held_restores(), 0);
  at_end_.clear();  // never run
  task_ = -1;
}

TEST_F(SavedRegionsTest, AnInPlaceChangeAfterTheSaveIsAnError) {
  at::Tensor h = make_tensor({16}, at::kFloat);
  const at::Tensor s = regions_->pack(h);
  h.add_(1);
  const std::string error = error_of([&] { unpack(s); });
  EXPECT_NE(error.find("modified in place after it was saved"), std::string::npos) << error;
}

TEST_F(SavedRegionsTest, AChangeBetweenTwoSavesCopiesAgain) {
  at::Tensor h = make_tensor({16}, at::kFloat);
  const at::Tensor s1 = regions_->pack(h);
  h.mul_(2);
  const at::Tensor s2 = regions_->pack(h);
  EXPECT_EQ(stats().saves, 2);
  EXPECT_TRUE(at::equal(unpack(s2), h));
  // The first save's tensor was changed after it was saved: as in autograd, an error.
  EXPECT_NE(error_of([&] { unpack(s1); }).find("modified in place"), std::string::npos);
}

TEST_F(SavedRegionsTest, NothingOutlivesTheSaveHandles) {
  {
    const at::Tensor h = make_tensor({128}, at::kFloat);
    const at::Tensor s1 = regions_->pack(h.slice(0, 0, 100));
    const at::Tensor s2 = regions_->pack(h.slice(0, 10, 20));
    EXPECT_EQ(regions_->live_storages(), 1);
    EXPECT_EQ(stats().live_handles, 1);
  }
  EXPECT_EQ(regions_->live_storages(), 0);
  EXPECT_EQ(stats().live_handles, 0);
}

TEST_F(SavedRegionsTest, ConcurrentPacksAndUnpacksAllGetTheirData) {
  // Backward unpacks on the autograd engine's threads (one per device) while a forward may pack.
  const at::Tensor h = make_tensor({64, 64}, at::kFloat);
  constexpr int kThreads = 8;
  std::vector<at::Tensor> saves(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] { saves[i] = regions_->pack(h.slice(0, i * 8, i * 8 + 8)); });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  task_ = 11;
  std::atomic<int> wrong{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int repeat = 0; repeat < 20; ++repeat) {
        if (!at::equal(unpack(saves[i]), h.slice(0, i * 8, i * 8 + 8))) wrong++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  end_backward();
  EXPECT_EQ(regions_->held_restores(), 0);
}

TEST_F(SavedRegionsTest, TensorsItCannotTakeAndForeignHandlesAreRefused) {
  EXPECT_NE(error_of([&] { regions_->pack(at::empty({0})); }).find("dense strided"),
            std::string::npos);
  EXPECT_NE(error_of([&] { unpack(make_tensor({4}, at::kFloat)); }).find("not a save handle"),
            std::string::npos);
}

}  // namespace
}  // namespace torch_offload
