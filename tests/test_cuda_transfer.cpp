// The real CUDA path: pinned host buffers, side-stream copies, prefetch and pool reuse on a GPU.
// Every test is skipped where no CUDA device is visible.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "csrc/manager.h"
#include "test_util.h"

#ifdef TORCH_OFFLOAD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace torch_offload {
namespace {

class CudaTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }

  void TearDown() override { testing::expect_nothing_held_and_drop(manager_); }

  static at::TensorOptions cuda(at::ScalarType dtype = at::kFloat) {
    return at::TensorOptions().device(c10::Device(c10::kCUDA, 0)).dtype(dtype);
  }

  std::shared_ptr<Manager> manager_;
};

// The disk tier's direct IO reads into and writes from these buffers whole pages at a time; the
// driver packs small pinned allocations into shared pages unless asked otherwise.
TEST_F(CudaTransferTest, PinnedBuffersOfSmallTensorsArePageAligned) {
  manager_ = Manager::create(ManagerConfig{});
  std::vector<at::Tensor> handles;
  for (int64_t n : {1, 7, 64, 300, 1024, 1025, 4096, 70000}) {
    handles.push_back(manager_->save(at::full({n}, static_cast<float>(n), cuda())));
  }
  for (const at::Tensor& h : handles) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(h.data_ptr()) % 4096, 0u) << h.numel() << " floats";
    at::Tensor y = manager_->restore(h, c10::Device(c10::kCUDA, 0));
    EXPECT_TRUE(at::equal(y, at::full({h.numel()}, static_cast<float>(h.numel()), cuda())));
  }
}

TEST_F(CudaTransferTest, HandleIsPinnedAndRestoreEqualsTheSource) {
  manager_ = Manager::create(ManagerConfig{});
  at::Tensor x = at::randn({1024, 257}, cuda());
  at::Tensor h = manager_->save(x);
  EXPECT_TRUE(h.is_cpu());
  EXPECT_TRUE(h.is_pinned()) << "the handle must live in pinned memory for asynchronous copies";
  EXPECT_EQ(h.sizes(), x.sizes());

  at::Tensor y = manager_->restore(h, x.device());
  EXPECT_TRUE(y.is_cuda());
  EXPECT_EQ(y.device(), x.device());
  EXPECT_TRUE(at::equal(y, x));  // queued on the current stream, after the copy back

  // "cuda" without an index names the current device.
  at::Tensor y2 = manager_->restore(h, c10::Device(c10::kCUDA));
  EXPECT_TRUE(at::equal(y2, x));

  // A CUDA-saved handle can also be restored on the CPU.
  at::Tensor y_cpu = manager_->restore(h, c10::Device(c10::kCPU));
  EXPECT_TRUE(y_cpu.is_cpu());
  EXPECT_TRUE(at::equal(y_cpu, x.cpu()));

  const OffloadStats s = manager_->stats();
  EXPECT_TRUE(s.pinned);
  EXPECT_EQ(s.saves, 1);
  EXPECT_EQ(s.restores, 3);
  EXPECT_EQ(s.bytes_to_host, static_cast<int64_t>(x.nbytes()));
}

TEST_F(CudaTransferTest, DtypesAndLayoutsRoundTrip) {
  manager_ = Manager::create(ManagerConfig{});
  std::vector<at::Tensor> xs = {
      at::randn({300, 7}, cuda()),
      at::randn({64, 64}, cuda()).to(at::kBFloat16),
      at::randint(-1000, 1000, {513}, cuda(at::kLong)),
      at::rand({99}, cuda()).gt(0.5),
      at::randn({40, 30}, cuda()).t(),  // non-contiguous
      at::empty({0, 5}, cuda()),
  };
  std::vector<at::Tensor> hs;
  for (const auto& x : xs) hs.push_back(manager_->save(x));
  for (size_t i = xs.size(); i-- > 0;) {
    at::Tensor y = manager_->restore(hs[i], c10::Device(c10::kCUDA, 0));
    EXPECT_EQ(y.scalar_type(), xs[i].scalar_type()) << i;
    EXPECT_TRUE(at::equal(y, xs[i])) << i;
  }
}

TEST_F(CudaTransferTest, LifoRestoreOfEightTensorsIsServedByPrefetch) {
  manager_ = Manager::create(ManagerConfig{});  // prefetch_depth = 1
  std::vector<at::Tensor> xs, hs;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(at::randn({256 + 32 * i, 128}, cuda()));
    hs.push_back(manager_->save(xs[i]));
  }
  for (int i = 7; i >= 0; --i) {
    EXPECT_TRUE(at::equal(manager_->restore(hs[i], c10::Device(c10::kCUDA, 0)), xs[i])) << i;
  }
  const OffloadStats s = manager_->stats();
  EXPECT_EQ(s.prefetches, 7);
  EXPECT_EQ(s.prefetch_hits, 7);
  EXPECT_EQ(s.restores, 8);
  EXPECT_LE(s.in_flight_peak, ManagerConfig{}.max_in_flight);
}

TEST_F(CudaTransferTest, SteadyStateStepsMakeNoNewHostAllocations) {
  manager_ = Manager::create(ManagerConfig{});
  const std::vector<std::vector<int64_t>> shapes = {{1024, 64}, {4096}, {17, 33}, {512, 512}};
  auto step = [&] {
    std::vector<at::Tensor> xs, hs;
    for (const auto& shape : shapes) {
      xs.push_back(at::randn(shape, cuda()));
      hs.push_back(manager_->save(xs.back()));
    }
    for (size_t i = shapes.size(); i-- > 0;) {
      EXPECT_TRUE(at::equal(manager_->restore(hs[i], c10::Device(c10::kCUDA, 0)), xs[i]));
    }
  };
  step();
  manager_->synchronize();
  const OffloadStats first = manager_->stats();
  EXPECT_EQ(first.host_bytes_in_use, 0);
  EXPECT_EQ(first.host_allocations, static_cast<int64_t>(shapes.size()));
  for (int s = 1; s <= 3; ++s) {
    step();
    manager_->synchronize();
    const OffloadStats now = manager_->stats();
    EXPECT_EQ(now.host_allocations, first.host_allocations) << "step " << s;
    EXPECT_EQ(now.pool_hits, first.pool_hits + s * static_cast<int64_t>(shapes.size()));
    EXPECT_EQ(now.host_bytes_in_use, 0);
    EXPECT_TRUE(now.pinned);
  }
}

TEST_F(CudaTransferTest, SourceIsReleasedAfterItsCopy) {
  manager_ = Manager::create(ManagerConfig{});
  at::Tensor h;
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> weak_storage;
  {
    at::Tensor x = at::randn({2048, 256}, cuda());
    weak_storage = x.storage().getWeakStorageImpl();
    h = manager_->save(x);
  }
  manager_->synchronize();
  EXPECT_TRUE(weak_storage->expired()) << "the GPU source outlived its copy and synchronize()";
}

TEST_F(CudaTransferTest, InPlaceModificationAfterSaveIsDetected) {
  manager_ = Manager::create(ManagerConfig{});
  at::Tensor x = at::randn({100}, cuda());
  at::Tensor h = manager_->save(x);
  x.mul_(2);
  EXPECT_THROW(manager_->restore(h, x.device()), c10::Error);
}

#ifdef TORCH_OFFLOAD_WITH_CUDA
TEST_F(CudaTransferTest, CopiesAreOrderedAgainstANonDefaultComputeStream) {
  // Sources are produced by queued work on the current (non-default) stream, dropped right after
  // save, and their memory is immediately requested again by new work on that stream: the copy must
  // read the values as of the save, not whatever the reused memory holds later.
  manager_ = Manager::create(testing::make_config(2, 1, 0));
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard guard(stream);
  std::vector<at::Tensor> hs, expected;
  for (int i = 0; i < 6; ++i) {
    at::Tensor a = at::randn({1024, 1024}, cuda());
    at::Tensor y = at::mm(a, a).add_(i);  // long enough that the copy would race it if unordered
    expected.push_back(y.clone());
    hs.push_back(manager_->save(y));
    y.reset();
    at::Tensor scribble = at::empty({1024, 1024}, cuda()).fill_(-1.0);  // may reuse y's block
    (void)scribble;
  }
  for (int i = 5; i >= 0; --i) {
    at::Tensor r = manager_->restore(hs[i], c10::Device(c10::kCUDA, 0));
    EXPECT_TRUE(at::equal(r, expected[i])) << i;
  }
  manager_->synchronize();
  stream.synchronize();
}

TEST_F(CudaTransferTest, ABatchOfCopiesIsOrderedAgainstANonDefaultComputeStream) {
  // As above, the copies queued in a batch (Manager::begin_batch) and issued at its end, after
  // all the work that produced them; one restore is asked for before the batch ends.
  manager_ = Manager::create(testing::make_config(4, 1, 0));
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard guard(stream);
  std::vector<at::Tensor> hs, expected;
  manager_->begin_batch();
  for (int i = 0; i < 6; ++i) {
    at::Tensor a = at::randn({1024, 1024}, cuda());
    at::Tensor y = at::mm(a, a).add_(i);
    expected.push_back(y.clone());
    hs.push_back(manager_->save(y));
    y.reset();
    at::Tensor scribble = at::empty({1024, 1024}, cuda()).fill_(-1.0);
    (void)scribble;
  }
  EXPECT_TRUE(at::equal(manager_->restore(hs[2], c10::Device(c10::kCUDA, 0)), expected[2]));
  for (int i = 6; i < 9; ++i) {  // a second batch, issued at the end
    at::Tensor y = at::randn({512, 1024}, cuda()).mul_(i);
    expected.push_back(y.clone());
    hs.push_back(manager_->save(y));
  }
  manager_->end_batch();
  for (int i = 8; i >= 0; --i) {
    if (i == 2) continue;
    at::Tensor r = manager_->restore(hs[i], c10::Device(c10::kCUDA, 0));
    EXPECT_TRUE(at::equal(r, expected[i])) << i;
  }
  const OffloadStats s = manager_->stats();
  EXPECT_EQ(s.batched_copies, 9);
  EXPECT_EQ(s.copy_batches, 2);
  manager_->synchronize();
  stream.synchronize();
}
#endif

}  // namespace
}  // namespace torch_offload
