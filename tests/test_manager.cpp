// Manager on CPU tensors driven through a fake asynchronous DeviceTransfer (fake_transfer.h): the
// basics of save and restore: round trips in every completion mode, in-place modification checks,
// restoring tensors that are not live handles, and the configurations and tensors it rejects.
// The in-flight bound, source lifetime and concurrent use are in test_manager_in_flight.cpp; the
// host buffer pool, the budget, prefetch and statistics in test_manager_prefetch_pool.cpp.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
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
// The lookup (Manager::find_entry_locked) compares strides and the storage offset too.
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
// Configurations and tensors the manager rejects.

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

}  // namespace
}  // namespace torch_offload
