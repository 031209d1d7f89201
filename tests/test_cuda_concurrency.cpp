// The real CUDA path under concurrency, on every tier: threads that save and restore their own
// GPU tensors on their own streams, and one handle restored by eight threads at once. Meant to be
// run under compute-sanitizer (memcheck, racecheck) too. Skipped without a CUDA device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "csrc/manager.h"
#include "test_util.h"

#ifdef TORCH_OFFLOAD_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace torch_offload {
namespace {

#ifdef TORCH_OFFLOAD_WITH_CUDA

const c10::Device kGpu(c10::kCUDA, 0);

at::TensorOptions gpu(at::ScalarType dtype = at::kFloat) {
  return at::TensorOptions().device(kGpu).dtype(dtype);
}

// Rounds of each test: `full` by default, scaled down by TORCH_OFFLOAD_TEST_ROUNDS_PERCENT
// (compute- sanitizer's racecheck runs every kernel ~100x slower).
int rounds(int full) {
  const char* percent = std::getenv("TORCH_OFFLOAD_TEST_ROUNDS_PERCENT");
  return percent == nullptr ? full : std::max(1, full * std::atoi(percent) / 100);
}

enum class Tier { kHost, kDisk };

class CudaConcurrencyTest : public ::testing::TestWithParam<Tier> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    ManagerConfig config;
    if (GetParam() == Tier::kDisk) {
      config.disk_dir = dir_.path();
      config.disk_only = true;
    }
    manager_ = Manager::create(config);
  }

  void TearDown() override { testing::expect_nothing_held_and_drop(manager_); }

  testing::TempDir dir_;  // the disk tier's files (unused by the host tier)
  std::shared_ptr<Manager> manager_;
};

// Each thread works on its own stream: saves a few tensors produced there, drops them, and restores
// them in backward order, as per-thread training steps sharing one engine would.
TEST_P(CudaConcurrencyTest, EightThreadsSaveAndRestoreOnTheirOwnStreams) {
  const int round_count = rounds(GetParam() == Tier::kDisk ? 20 : 100);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, 0);
      c10::cuda::CUDAStreamGuard guard(stream);
      for (int r = 0; r < round_count; ++r) {
        std::vector<at::Tensor> expected, handles;
        for (int i = 0; i < 3; ++i) {
          at::Tensor x = at::arange(4096 * (i + 1), gpu()).add_(t * 1000 + r * 10 + i);
          expected.push_back(x.clone());
          handles.push_back(manager_->save(x));
        }
        for (int i = 2; i >= 0; --i) {
          if (!at::equal(manager_->restore(handles[i], kGpu), expected[i])) wrong++;
        }
      }
      stream.synchronize();
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0) << "restores returned another thread's or stale data";
}

// Eight threads restore the same two handles to the GPU, 1000 rounds each (restoring b reads a
// ahead; the restores of a race for that read).
TEST_P(CudaConcurrencyTest, OneHandleRestoredFromEightThreadsGivesItsDataEveryTime) {
  const int round_count = rounds(GetParam() == Tier::kDisk ? 200 : 1000);
  const at::Tensor a = at::arange(1024, gpu()), b = at::arange(1024, gpu()).neg_();
  const at::Tensor ha = manager_->save(a), hb = manager_->save(b);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, 0);
      c10::cuda::CUDAStreamGuard guard(stream);
      for (int round = 0; round < round_count; ++round) {
        if (!at::equal(manager_->restore(hb, kGpu), b)) wrong++;
        if (!at::equal(manager_->restore(ha, kGpu), a)) wrong++;
      }
      stream.synchronize();
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  manager_->synchronize();
  EXPECT_EQ(manager_->stats().restores, 2 * 8 * round_count);
}

INSTANTIATE_TEST_SUITE_P(Tiers, CudaConcurrencyTest, ::testing::Values(Tier::kHost, Tier::kDisk),
                         [](const auto& info) {
                           return info.param == Tier::kHost ? "Host" : "Disk";
                         });

#endif  // TORCH_OFFLOAD_WITH_CUDA

}  // namespace
}  // namespace torch_offload
