#pragma once
// The base of the tests that need O_DIRECT: a temporary directory, and the test skipped when its
// filesystem refuses O_DIRECT (ext4, xfs and tmpfs from Linux 6.6 take it).
#include <gtest/gtest.h>

#include "csrc/direct_io_policy.h"
#include "csrc/disk_store.h"
#include "test_util.h"

namespace torch_offload::testing {

class DirectIoDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DiskStore probe(dir_.path(), 1, DirectIo::kAlways);
    if (!probe.direct_io()) GTEST_SKIP() << "no O_DIRECT on the filesystem of " << dir_.path();
  }
  TempDir dir_;
};

}  // namespace torch_offload::testing
