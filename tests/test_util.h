#pragma once
// Small helpers shared by the test files.
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/cuda.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "csrc/manager.h"
#include "csrc/manager_config.h"

namespace torch_offload::testing {

inline const c10::Device kCPU(c10::kCPU);

// Long enough for a wrongly unblocked waiter to have returned; short enough to keep tests fast.
constexpr std::chrono::milliseconds kSettle{100};

// The message of the c10::Error `fn` throws; fails the test when it throws nothing.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "expected a c10::Error";
  return "";
}

template <typename T>
bool finishes_within(std::future<T>& f,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  return f.wait_for(timeout) == std::future_status::ready;
}

// Polls `cond` (something a background thread makes true) for up to 10 s.
template <typename Cond>
bool eventually(Cond&& cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// A ManagerConfig with the fields these tests care about; everything else keeps its default.
inline ManagerConfig make_config(int64_t max_in_flight, int64_t prefetch_depth = 1,
                                 int64_t host_budget_bytes = 0) {
  ManagerConfig config;
  config.max_in_flight = max_in_flight;
  config.prefetch_depth = prefetch_depth;
  config.host_budget_bytes = host_budget_bytes;
  return config;
}

// A fresh directory under the system's temporary directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "to_test_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  // Regular files anywhere below the directory.
  int files() const {
    int n = 0;
    for (auto& e : std::filesystem::recursive_directory_iterator(path_)) n += e.is_regular_file();
    return n;
  }

 private:
  std::string path_;
};

// The end of a CUDA test: once the manager's copies and the GPU are done, nothing is held (no
// live handle, no host bytes in use); then the manager is dropped.
inline void expect_nothing_held_and_drop(std::shared_ptr<Manager>& manager) {
  if (!manager) return;
  manager->synchronize();
  torch::cuda::synchronize();
  EXPECT_EQ(manager->stats().live_handles, 0);
  EXPECT_EQ(manager->stats().host_bytes_in_use, 0);
  manager.reset();
}

}  // namespace torch_offload::testing
