// ComputeWaitTimer (csrc/compute_wait_timer.h): the compute stream's waits on copies, timed with
// reused event pairs that are read back as new waits come. Skipped where no CUDA device is visible.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#ifdef TORCH_OFFLOAD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "csrc/compute_wait_timer.h"

namespace torch_offload {
namespace {

class ComputeWaitTimerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(ComputeWaitTimerTest, AWaitBehindLongWorkOnAnotherStreamIsCounted) {
  ComputeWaitTimer timer;
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(0);
  at::cuda::CUDAEvent done(cudaEventDisableTiming);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    at::Tensor a = at::randn({4096, 4096}, at::TensorOptions().device(at::kCUDA));
    for (int i = 0; i < 20; ++i) a = at::mm(a, a).div_(4096.0);  // ~tens of ms on any GPU
    done.record(side);
  }
  timer.wait(compute, done);
  compute.synchronize();
  EXPECT_GT(timer.waited_ms(), 0.1);
  timer.reset();
  EXPECT_EQ(timer.waited_ms(), 0.0);
  EXPECT_EQ(timer.pending(), 0u);
}

TEST_F(ComputeWaitTimerTest, WaitsThatAreNeverAskedAboutHoldABoundedNumberOfEvents) {
  // A training run that never reads the statistics must not accumulate events without end.
  ComputeWaitTimer timer;
  c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(0);
  at::cuda::CUDAEvent done(cudaEventDisableTiming);
  done.record(compute);
  for (int i = 0; i < 2000; ++i) {
    timer.wait(compute, done);
    if (i % 100 == 0) compute.synchronize();  // let earlier pairs complete
  }
  EXPECT_LE(timer.pending(), 400u);
  compute.synchronize();
  EXPECT_GE(timer.waited_ms(), 0.0);
  EXPECT_EQ(timer.pending(), 0u);
}

}  // namespace
}  // namespace torch_offload
#endif
