// disk_direct_io='auto' (DirectIo::kWhenRamIsShort): each file of the disk tier goes around the
// page cache only when the host's available RAM cannot hold it beside the files already kept
// through the page cache; both kinds of file live side by side in one manager and every tensor
// comes back bit for bit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "csrc/direct_io_policy.h"
#include "csrc/disk_store.h"
#include "csrc/manager.h"
#include "direct_io_fixture.h"
#include "test_util.h"

namespace torch_offload {
namespace {

using testing::error_of;
using testing::kCPU;
using testing::TempDir;

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(DirectIoPolicy, FixedChoicesIgnoreRam) {
  DirectIoPolicy never(DirectIo::kNever), always(DirectIo::kAlways);
  never.simulate_available_ram(0);
  always.simulate_available_ram(100 * kGiB);
  EXPECT_FALSE(never.choose(kGiB));
  EXPECT_TRUE(always.choose(kGiB));
}

TEST(DirectIoPolicy, FilesGoAroundThePageCacheOnceRamCannotHoldThem) {
  DirectIoPolicy policy(DirectIo::kWhenRamIsShort);
  policy.simulate_available_ram(4 * kGiB);  // room for 3 GiB of files beside the 1 GiB headroom
  EXPECT_FALSE(policy.choose(kGiB));
  EXPECT_FALSE(policy.choose(kGiB));
  EXPECT_FALSE(policy.choose(kGiB));
  EXPECT_TRUE(policy.choose(kGiB)) << "a fourth GiB leaves less than the headroom";
  EXPECT_TRUE(policy.choose(1));
  policy.file_closed(kGiB, /*direct=*/true);  // a direct file frees no page cache
  EXPECT_TRUE(policy.choose(kGiB));
  policy.file_closed(kGiB, /*direct=*/false);  // a cached one does
  EXPECT_FALSE(policy.choose(kGiB));
}

TEST(DirectIoPolicy, ReadsTheHostsAvailableRam) {
  const int64_t available = available_ram_bytes();
  EXPECT_GT(available, 0) << "/proc/meminfo has MemAvailable on every Linux since 3.14";
}

ManagerConfig auto_disk(const std::string& dir) {
  ManagerConfig config;
  config.disk_dir = dir;
  config.disk_only = true;
  config.disk_direct_io_auto = true;
  return config;
}

at::Tensor pattern(int64_t n, int seed) {
  return at::arange(n, at::kLong).mul_(17).add_(seed).remainder_(253).to(at::kByte);
}

class DirectIoAutoTest : public testing::DirectIoDirTest {};

TEST_F(DirectIoAutoTest, PlentyOfRamKeepsThePageCacheAndShortRamGoesAroundIt) {
  auto manager = Manager::create(auto_disk(dir_.path()));
  manager->simulate_available_ram(100 * kGiB);
  const std::vector<int64_t> sizes = {4097, 1 << 20, 12345};
  std::vector<at::Tensor> xs, hs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    xs.push_back(pattern(sizes[i], static_cast<int>(i)));
    hs.push_back(manager->save(xs.back()));
  }
  manager->synchronize();
  OffloadStats stats = manager->stats();
  EXPECT_EQ(stats.disk_direct_io, 2);
  EXPECT_EQ(stats.disk_bytes_written_direct, 0);

  manager->simulate_available_ram(0);  // RAM is short from here on: the next files go direct
  int64_t direct_bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    xs.push_back(pattern(sizes[i], static_cast<int>(10 + i)));
    hs.push_back(manager->save(xs.back()));
    direct_bytes += sizes[i];
  }
  manager->synchronize();
  stats = manager->stats();
  EXPECT_EQ(stats.disk_bytes_written_direct, direct_bytes);
  EXPECT_EQ(stats.disk_bytes_written, 2 * direct_bytes);
  for (size_t i = xs.size(); i-- > 0;) {
    EXPECT_TRUE(at::equal(manager->restore(hs[i], kCPU), xs[i])) << i;
  }
}

TEST(DirectIoAutoConfig, AutoWithoutADiskDirOrBesideTrueIsAClearError) {
  ManagerConfig config;
  config.disk_direct_io_auto = true;
  std::string error = error_of([&] { Manager::create(config); });
  EXPECT_NE(error.find("disk_direct_io='auto' is for the disk tier"), std::string::npos) << error;
  TempDir dir;
  config = auto_disk(dir.path());
  config.disk_direct_io = true;
  error = error_of([&] { Manager::create(config); });
  EXPECT_NE(error.find("True or 'auto', not both"), std::string::npos) << error;
}

}  // namespace
}  // namespace torch_offload
