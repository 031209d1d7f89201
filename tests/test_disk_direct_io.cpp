// The disk tier with direct IO (disk_direct_io): files bypass the page cache, transfers are whole
// blocks, and every size of tensor still comes back bit for bit; the handle reads as its data; a
// buffer that is not block-aligned falls back to the page cache for its file instead of failing.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "csrc/disk_store.h"
#include "csrc/manager.h"
#include "direct_io_fixture.h"
#include "test_util.h"

namespace torch_offload {
namespace {

using testing::error_of;
using testing::kCPU;

at::Tensor bytes_pattern(int64_t n, int seed) {
  return at::arange(n, at::kLong).mul_(31).add_(seed).remainder_(251).to(at::kByte);
}

ManagerConfig direct_disk(const std::string& dir) {
  ManagerConfig config;
  config.disk_dir = dir;
  config.disk_only = true;
  config.disk_direct_io = true;
  config.prefetch_depth = 2;
  return config;
}

class DiskDirectIoTest : public testing::DirectIoDirTest {};

// Sizes around the block (4096): the padding written and read back never shows in the tensor.
TEST_F(DiskDirectIoTest, EverySizeComesBackBitForBitAndNothingIsReadFromThePageCache) {
  auto manager = Manager::create(direct_disk(dir_.path()));
  const std::vector<int64_t> sizes = {1, 4095, 4096, 4097, 3 * 4096 + 17, 1 << 20, 0};
  std::vector<at::Tensor> xs, hs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    xs.push_back(bytes_pattern(sizes[i], static_cast<int>(i)));
    hs.push_back(manager->save(xs.back()));
  }
  manager->synchronize();
  EXPECT_EQ(manager->stats().disk_direct_io, 1);
  for (size_t i = sizes.size(); i-- > 0;) {
    EXPECT_TRUE(at::equal(manager->restore(hs[i], kCPU), xs[i])) << sizes[i];
  }
  for (size_t i = 0; i < sizes.size(); ++i) {  // again: now every one is read from its file
    EXPECT_TRUE(at::equal(manager->restore(hs[i], kCPU), xs[i])) << sizes[i];
  }
  const OffloadStats stats = manager->stats();
  int64_t total = 0;
  for (int64_t size : sizes) total += size;
  EXPECT_EQ(stats.disk_bytes_written, total) << "a failed write keeps its data in memory";
  EXPECT_GE(stats.disk_bytes_read, total);
  EXPECT_EQ(stats.disk_bytes_read_from_page_cache, 0);
}

// Layer offloading installs the handle as a parameter's data: the file mapped copy-on-write must
// show what the direct write put on the disk.
TEST_F(DiskDirectIoTest, TheHandleReadsAsItsDataOnceWritten) {
  auto manager = Manager::create(direct_disk(dir_.path()));
  const at::Tensor x = at::arange(3000, at::kFloat).reshape({60, 50});
  const at::Tensor h = manager->save(x);
  manager->synchronize();
  EXPECT_TRUE(at::equal(h, x));
}

// The page-cache tier is the default: the same saves read through it.
TEST_F(DiskDirectIoTest, WithoutTheOptionFilesGoThroughThePageCache) {
  ManagerConfig config = direct_disk(dir_.path());
  config.disk_direct_io = false;
  auto manager = Manager::create(config);
  const at::Tensor x = bytes_pattern(1 << 20, 3), y = bytes_pattern(1 << 20, 4);
  const at::Tensor hx = manager->save(x), hy = manager->save(y);
  manager->synchronize();
  EXPECT_EQ(manager->stats().disk_direct_io, 0);
  EXPECT_TRUE(at::equal(manager->restore(hy, kCPU), y));
  EXPECT_TRUE(at::equal(manager->restore(hx, kCPU), x));
}

// Files around the page cache are closed when freed: keeping one saves no page-cache work, and with
// disk_direct_io="auto" a file kept would hold RAM the policy counts as free.
TEST_F(DiskDirectIoTest, NoFileIsKeptForReuseWhenFilesMayBypassThePageCache) {
  for (DirectIo mode : {DirectIo::kAlways, DirectIo::kWhenRamIsShort}) {
    DiskStore store(dir_.path(), 1, mode);
    store.remove(store.new_file(1 << 20).id);
    EXPECT_EQ(store.bytes_cached(), 0) << static_cast<int>(mode);
  }
  DiskStore through_the_page_cache(dir_.path(), 1, DirectIo::kNever);
  through_the_page_cache.remove(through_the_page_cache.new_file(1 << 20).id);
  EXPECT_EQ(through_the_page_cache.bytes_cached(), 1 << 20);
}

// DiskStore's callers pass aligned buffers; one that is not (a future caller's mistake) must not
// turn into an EINVAL on every write: that file goes through the page cache instead.
TEST_F(DiskDirectIoTest, AMisalignedBufferFallsBackToThePageCacheForItsFile) {
  DiskStore store(dir_.path(), 1, DirectIo::kAlways);
  const size_t size = 10000;
  ASSERT_EQ(store.buffer_size(size), 3 * 4096u);
  // Block-aligned memory, used from 8 bytes in.
  std::unique_ptr<unsigned char, decltype(&std::free)> out(
      static_cast<unsigned char*>(std::aligned_alloc(4096, 4 * 4096)), &std::free),
      in(static_cast<unsigned char*>(std::aligned_alloc(4096, 4 * 4096)), &std::free);
  unsigned char* misaligned = out.get() + 8;
  for (size_t i = 0; i < size; ++i) misaligned[i] = static_cast<unsigned char>(i * 7);
  const int64_t id = store.new_file(size).id;
  std::promise<std::string> written;
  store.write_async(
      id, [] {}, misaligned, size, [&](const std::string& e, bool) { written.set_value(e); });
  ASSERT_EQ(written.get_future().get(), "");
  EXPECT_EQ(store.read(id, in.get() + 8, size), "");
  EXPECT_EQ(std::memcmp(in.get() + 8, misaligned, size), 0);
}

TEST(DiskDirectIoConfig, DirectIoWithoutADiskDirIsAClearError) {
  ManagerConfig config;
  config.disk_direct_io = true;
  const std::string error = error_of([&] { Manager::create(config); });
  EXPECT_NE(error.find("disk_direct_io=True is for the disk tier"), std::string::npos) << error;
}

}  // namespace
}  // namespace torch_offload
