// The tiers under concurrency and faults: one handle restored from many threads on every tier,
// allocation failures injected at every allocation site of the disk path, an IO thread that cannot
// start, and tensors that are not live handles of the manager they are restored through. Cases
// that crashed or hung before their fix run in a death-test child, so the suite survives them.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "csrc/disk_store.h"
#include "csrc/fault_injection.h"
#include "csrc/manager.h"
#include "fake_transfer.h"
#include "test_util.h"

namespace torch_offload {
namespace {

using testing::Completion;
using testing::error_of;
using testing::FakeTransfer;
using testing::finishes_within;

using testing::kCPU;
using testing::kSettle;
using testing::TempDir;

at::Tensor values(int64_t n, int64_t seed) {
  return at::arange(n, at::kFloat).mul_(0.5).add_(static_cast<double>(seed));
}

// kDirect: the disk tier with direct IO (O_DIRECT; the page cache where the filesystem refuses).
enum class TierKind { kHost, kDisk, kSpill, kDirect };

ManagerConfig config_for(TierKind kind, const std::string& dir) {
  ManagerConfig config;
  config.max_in_flight = 4;
  config.prefetch_depth = 2;
  if (kind == TierKind::kDisk || kind == TierKind::kDirect) {
    config.disk_dir = dir;
    config.disk_only = true;
    config.disk_direct_io = kind == TierKind::kDirect;
  } else if (kind == TierKind::kSpill) {
    config.disk_dir = dir;
    config.host_budget_bytes = 8192;  // the first tensor stays in host memory, the rest spill
  }
  return config;
}

class TierTest : public ::testing::TestWithParam<TierKind> {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
  void TearDown() override { clear_injected_faults(); }
  std::shared_ptr<Manager> make(Completion completion = Completion::kBackground) {
    return Manager::create(config_for(GetParam(), dir_.path()),
                           std::make_shared<FakeTransfer>(completion));
  }
  TempDir dir_;
};

// 8 threads restore the same two handles 1000 times each. The disk tier used to hand one
// read-ahead buffer to two restores (wrong data, then "double free or corruption").
void restore_one_handle_from_many_threads(Manager& manager) {
  const at::Tensor a = values(1024, 1), b = values(1024, 2);
  const at::Tensor ha = manager.save(a), hb = manager.save(b);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 1000; ++round) {
        // Restoring b reads a ahead; the restores of a race for that read.
        if (!at::equal(manager.restore(hb, kCPU), b)) wrong++;
        if (!at::equal(manager.restore(ha, kCPU), a)) wrong++;
      }
    });
  }
  for (auto& t : threads) t.join();
  if (wrong.load() != 0) {
    std::fprintf(stderr, "%d restores returned wrong data\n", wrong.load());
    std::exit(1);
  }
}

TEST_P(TierTest, OneHandleRestoredFromEightThreadsGivesItsDataEveryTime) {
  EXPECT_EXIT(
      {
        auto manager = make();
        restore_one_handle_from_many_threads(*manager);
        manager->synchronize();
        std::exit(manager->stats().restores == 16000 ? 0 : 2);
      },
      ::testing::ExitedWithCode(0), "");
}

// A save, restores in backward order (which read ahead) and the handles' release, with a fault
// armed: each step either works or throws a clear error, and nothing hangs or leaks afterwards.
void save_restore_release(Manager& manager) {
  std::vector<at::Tensor> xs, hs;
  for (int i = 0; i < 3; ++i) xs.push_back(values(3000, i));
  try {
    for (const auto& x : xs) hs.push_back(manager.save(x));
  } catch (const c10::Error&) {
  }
  for (size_t i = hs.size(); i-- > 0;) {
    try {
      EXPECT_TRUE(at::equal(manager.restore(hs[i], kCPU), xs[i])) << "wrong data, handle " << i;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("out of host memory"), std::string::npos) << e.what();
    }
  }
}

TEST_P(TierTest, InjectedFailuresAtEverySiteAreErrorsNeverHangsOrLeaks) {
  const FaultSite sites[] = {FaultSite::kDiskWriteStaging, FaultSite::kDiskReadAheadStaging,
                             FaultSite::kDiskRestoreStaging, FaultSite::kHandleContext};
  for (FaultSite site : sites) {
    for (int skip = 0; skip < 4; ++skip) {
      SCOPED_TRACE("site " + std::to_string(static_cast<int>(site)) + " skip " +
                   std::to_string(skip));
      auto manager = make();
      inject_fault(site, skip, /*times=*/1);
      auto run = std::async(std::launch::async, [&] {
        save_restore_release(*manager);
        clear_injected_faults();
        save_restore_release(*manager);  // works again once memory is back
        manager->synchronize();
      });
      ASSERT_TRUE(finishes_within(run)) << "hang";
      const OffloadStats s = manager->stats();
      EXPECT_EQ(s.live_handles, 0);
      EXPECT_EQ(s.disk_files, 0);
      EXPECT_EQ(s.host_bytes_in_use, 0);
    }
  }
}

// Before the fix a failed read-ahead left its entry marked as reading: the restore, or the
// handle's release at garbage collection, then waited forever.
TEST_P(TierTest, FailedReadAheadIsNotAHang) {
  auto manager = make(Completion::kImmediate);
  const at::Tensor a = values(3000, 1), b = values(3000, 2);
  auto run = std::async(std::launch::async, [&] {
    at::Tensor ha = manager->save(a), hb = manager->save(b);
    manager->synchronize();
    inject_fault(FaultSite::kDiskReadAheadStaging, 0, 1);
    EXPECT_TRUE(at::equal(manager->restore(hb, kCPU), b));  // reads a ahead: that fails
    clear_injected_faults();
    EXPECT_TRUE(at::equal(manager->restore(ha, kCPU), a));
  });
  ASSERT_TRUE(finishes_within(run)) << "hang";
  manager->synchronize();
  EXPECT_EQ(manager->stats().live_handles, 0);
}

TEST_P(TierTest, AHandleRestoredThroughAnotherManagerIsAClearError) {
  auto manager = make(), other = make();
  const at::Tensor h = manager->save(values(3000, 1));
  const std::string error = error_of([&] { other->restore(h, kCPU); });
  EXPECT_NE(error.find("is a handle of OffloadManager id " + std::to_string(manager->id())),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("not of id " + std::to_string(other->id())), std::string::npos) << error;
  EXPECT_NE(error_of([&] { other->restore(h.t(), kCPU); }).find("is a handle of"),
            std::string::npos);
}

std::string tier_name(const ::testing::TestParamInfo<TierKind>& info) {
  switch (info.param) {
    case TierKind::kHost:
      return "Host";
    case TierKind::kDisk:
      return "Disk";
    case TierKind::kSpill:
      return "Spill";
    case TierKind::kDirect:
      return "DiskDirectIo";
  }
  return "";
}

INSTANTIATE_TEST_SUITE_P(Tiers, TierTest,
                         ::testing::Values(TierKind::kHost, TierKind::kDisk, TierKind::kSpill,
                                           TierKind::kDirect),
                         tier_name);

class DiskHandleTest : public ::testing::Test {
 protected:
  void TearDown() override { clear_injected_faults(); }
  TempDir dir_;
};

// A disk handle holds no data: its views used to come back as the bytes of a small key block,
// broadcast.
TEST_F(DiskHandleTest, ViewsOfADiskHandleAreErrors) {
  auto manager = Manager::create(config_for(TierKind::kDisk, dir_.path()));
  const at::Tensor x = values(64, 3).reshape({8, 8});
  const at::Tensor h = manager->save(x);
  manager->synchronize();
  // The square transpose has the handle's sizes and dtype: only its strides tell it apart.
  for (const at::Tensor& view : {h.t(), h[1], h.narrow(1, 0, 4), h.view(at::kInt)}) {
    const std::string error = error_of([&] { manager->restore(view, kCPU); });
    EXPECT_NE(error.find("a view of a disk-tier handle"), std::string::npos) << error;
  }
  EXPECT_TRUE(at::equal(manager->restore(h, kCPU), x));
}

// The README lets a handle be read once synchronize() returned; a disk handle used to read as its
// key's bytes broadcast (1.7e13 everywhere). It is the file mapped copy-on-write now.
TEST_F(DiskHandleTest, ADiskHandleReadsAsItsDataOnceWritten) {
  auto manager = Manager::create(config_for(TierKind::kDisk, dir_.path()));
  const at::Tensor x = values(3000, 5).reshape({60, 50});
  const at::Tensor h = manager->save(x);
  manager->synchronize();
  EXPECT_TRUE(at::equal(h, x));
  EXPECT_TRUE(at::equal(manager->restore(h.clone(), kCPU), x));
  h.add_(1);  // the process's own copy of the page: the file keeps the saved bytes
  EXPECT_TRUE(at::equal(manager->restore(h, kCPU), x));
}

// `count` tensors of `n` values saved, their copies finished: (the tensors, their handles).
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> save_values(Manager& manager, int count,
                                                                        int64_t n) {
  std::vector<at::Tensor> xs, hs;
  for (int i = 0; i < count; ++i) {
    xs.push_back(values(n, i));
    hs.push_back(manager.save(xs.back()));
  }
  manager.synchronize();
  return {xs, hs};
}

// Backward's first restore (the newest save) is served from memory, the newest file's bytes being
// kept there; it reads files further ahead than it copies to the device (a file read is the
// slower step): restoring the last of six saves with prefetch_depth 1 reads the three before it.
TEST_F(DiskHandleTest, BackwardStartsFromMemoryAndReadsDiskReadAheadFilesAhead) {
  ManagerConfig config = config_for(TierKind::kDisk, dir_.path());
  config.prefetch_depth = 1;
  auto manager = Manager::create(config);
  const auto [xs, hs] = save_values(*manager, 6, 1000);
  const int64_t file_bytes = 1000 * 4;
  EXPECT_EQ(manager->stats().disk_bytes_written, 6 * file_bytes);
  EXPECT_TRUE(at::equal(manager->restore(hs[5], kCPU), xs[5]));
  manager->synchronize();
  EXPECT_EQ(manager->stats().disk_bytes_read, config.disk_read_ahead * file_bytes);
  for (int i = 4; i >= 0; --i) EXPECT_TRUE(at::equal(manager->restore(hs[i], kCPU), xs[i])) << i;
  EXPECT_EQ(manager->stats().prefetch_hits, 5);
  EXPECT_EQ(manager->stats().disk_bytes_read, 5 * file_bytes);
  // Restored again (a handle may be restored more than once), the newest is read from its file.
  EXPECT_TRUE(at::equal(manager->restore(hs[5], kCPU), xs[5]));
  manager->synchronize();
  EXPECT_EQ(manager->stats().disk_bytes_read, 6 * file_bytes);
}

// disk_read_wait_ms counts the time restores waited for a file's bytes; without read-ahead
// (prefetch_depth 0) each restore of an older file reads it itself, and reset_stats() zeroes it.
TEST_F(DiskHandleTest, RestoresThatReadTheirFileCountTheirWait) {
  ManagerConfig config = config_for(TierKind::kDisk, dir_.path());
  config.prefetch_depth = 0;
  auto manager = Manager::create(config);
  const auto [xs, hs] = save_values(*manager, 4, 1 << 16);
  EXPECT_EQ(manager->stats().disk_read_wait_ms, 0.0) << "nothing restored yet";
  for (int i = 2; i >= 0; --i) EXPECT_TRUE(at::equal(manager->restore(hs[i], kCPU), xs[i])) << i;
  EXPECT_EQ(manager->stats().disk_bytes_read, 3 * (1 << 16) * 4);
  EXPECT_GT(manager->stats().disk_read_wait_ms, 0.0);
  manager->reset_stats();
  EXPECT_EQ(manager->stats().disk_read_wait_ms, 0.0);
  EXPECT_EQ(manager->stats().disk_bytes_read, 3 * (1 << 16) * 4)
      << "a total over the manager's life";
}

// disk_create_ms and disk_close_ms time making each file (on save) and freeing it (when its
// handle is freed: closed, or kept for reuse), and count from the last reset_stats().
TEST_F(DiskHandleTest, MakingAndFreeingFilesIsTimed) {
  auto manager = Manager::create(config_for(TierKind::kDisk, dir_.path()));
  auto [xs, hs] = save_values(*manager, 4, 1 << 16);
  EXPECT_GT(manager->stats().disk_create_ms, 0.0);
  EXPECT_EQ(manager->stats().disk_close_ms, 0.0) << "every file still open";
  manager->reset_stats();
  EXPECT_EQ(manager->stats().disk_create_ms, 0.0);
  hs.clear();
  manager->synchronize();
  EXPECT_EQ(manager->stats().disk_files, 0);
  EXPECT_GT(manager->stats().disk_close_ms, 0.0);
  EXPECT_EQ(manager->stats().disk_create_ms, 0.0) << "no file made since the reset";
  manager->reset_stats();
  EXPECT_EQ(manager->stats().disk_close_ms, 0.0);
}

// Each write in flight holds an IO thread and its staging buffer: disk_io_threads of them may be
// under way whatever max_in_flight (at least io_threads here) allows the device copies. With
// max_in_flight=0 they used to count as one write at a time; otherwise max_in_flight bounded them,
// whatever the threads.
void expect_writes_in_flight(const std::string& dir, int64_t max_in_flight, int64_t io_threads) {
  ManagerConfig config = config_for(TierKind::kDisk, dir);
  config.max_in_flight = max_in_flight;
  config.disk_io_threads = io_threads;
  auto transfer = std::make_shared<FakeTransfer>(Completion::kManual);  // copies land when told
  auto manager = Manager::create(config, transfer);
  std::vector<at::Tensor> xs, hs;
  for (int64_t i = 0; i <= io_threads; ++i) xs.push_back(values(256, i));
  auto first = std::async(std::launch::async, [&] {
    for (int64_t i = 0; i < io_threads; ++i) hs.push_back(manager->save(xs[i]));
  });
  const bool went_ahead = first.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
  while (first.wait_for(kSettle) != std::future_status::ready) transfer->complete_all();
  EXPECT_TRUE(went_ahead) << "a save waited with fewer writes in flight than IO threads";
  auto next = std::async(std::launch::async, [&] { return manager->save(xs[io_threads]); });
  EXPECT_EQ(next.wait_for(kSettle), std::future_status::timeout)
      << "a write in flight beyond the " << io_threads << " IO threads";
  transfer->fences(FakeTransfer::Kind::kToHost).at(0)->complete();  // the first write can end
  ASSERT_TRUE(finishes_within(next));
  hs.push_back(next.get());
  transfer->set_mode(Completion::kImmediate);
  for (int64_t i = io_threads; i >= 0; --i) {
    EXPECT_TRUE(at::equal(manager->restore(hs[i], kCPU), xs[i])) << i;
  }
}

TEST_F(DiskHandleTest, UnboundedCopiesAllowOneWriteInFlightPerIoThread) {
  expect_writes_in_flight(dir_.path(), /*max_in_flight=*/0, /*io_threads=*/3);
}

TEST_F(DiskHandleTest, WritesInFlightAreBoundedByIoThreadsNotByCopies) {
  expect_writes_in_flight(dir_.path(), /*max_in_flight=*/8, /*io_threads=*/2);
}

TEST(DiskIoThreads, AreCheckedAndNeedADiskDir) {
  TempDir dir;
  ManagerConfig none = config_for(TierKind::kDisk, dir.path());
  none.disk_io_threads = 0;
  const std::string no_thread = error_of([&] { Manager::create(none); });
  EXPECT_NE(no_thread.find("disk_io_threads must be 1 to 256, got 0"), std::string::npos)
      << no_thread;
  none.disk_io_threads = int64_t{1} << 32;  // not narrowed to an int of 0 threads
  const std::string too_many = error_of([&] { Manager::create(none); });
  EXPECT_NE(too_many.find("got 4294967296"), std::string::npos) << too_many;
  ManagerConfig no_disk;
  no_disk.disk_io_threads = 8;
  const std::string no_tier = error_of([&] { Manager::create(no_disk); });
  EXPECT_NE(no_tier.find("disk_io_threads=8 is for the disk tier"), std::string::npos) << no_tier;
}

// Backward's first restore usually comes while the newest file is still being written: it reads
// the bytes the write reads, and whichever finishes last frees them.
TEST_P(TierTest, RestoresWhileTheWriteIsUnderWayGiveTheData) {
  auto manager = make();
  for (int round = 0; round < 300; ++round) {
    const at::Tensor x = values(4096, round);
    at::Tensor h = manager->save(x);
    ASSERT_TRUE(at::equal(manager->restore(h, kCPU), x)) << round;
    if (round % 3 == 0) {
      ASSERT_TRUE(at::equal(manager->restore(h, kCPU), x)) << round;
    }
    if (round % 2 == 0) h.reset();  // released with the write or a restore maybe under way
  }
  manager->synchronize();
  EXPECT_EQ(manager->stats().restores, 300 + 100);
}

// A failed write keeps the data in host memory; the handle read as the zeros of the reserved
// file, so a frozen weight installed from it (offload_layers) was silently zero.
TEST_F(DiskHandleTest, ADiskHandleWhoseWriteFailedStillReadsAsItsData) {
  auto manager = Manager::create(config_for(TierKind::kDisk, dir_.path()));
  manager->simulate_full_disk(true);
  const at::Tensor x = values(3000, 7).reshape({60, 50});
  const at::Tensor h = manager->save(x);
  manager->synchronize();
  EXPECT_TRUE(at::equal(h, x));
  EXPECT_TRUE(at::equal(manager->restore(h, kCPU), x));
}

// The fake kernel (torch_offload/_ops.py) says a handle is contiguous; a disk handle had stride 0.
TEST_F(DiskHandleTest, ADiskHandleIsContiguousLikeTheFakeKernelSays) {
  auto manager = Manager::create(config_for(TierKind::kDisk, dir_.path()));
  const at::Tensor h = manager->save(values(60, 1).reshape({3, 4, 5}).transpose(0, 2));
  EXPECT_TRUE(h.is_contiguous());
  EXPECT_EQ(h.sizes(), at::IntArrayRef({5, 4, 3}));
}

// Two stores in one directory with the same file ids (as two processes in different PID
// namespaces were): each reads its own data.
TEST_F(DiskHandleTest, TwoStoresInOneDirectoryNeverSeeEachOthersFiles) {
  DiskStore a(dir_.path(), 1), b(dir_.path(), 1);
  const at::Tensor xa = values(1000, 1), xb = values(1000, 2);
  const int64_t ia = a.new_file(xa.nbytes()).id, ib = b.new_file(xb.nbytes()).id;
  ASSERT_EQ(ia, ib);
  std::promise<std::string> wa, wb;
  a.write_async(
      ia, [] {}, xa.const_data_ptr(), xa.nbytes(),
      [&](const std::string& e, bool) { wa.set_value(e); });
  b.write_async(
      ib, [] {}, xb.const_data_ptr(), xb.nbytes(),
      [&](const std::string& e, bool) { wb.set_value(e); });
  ASSERT_EQ(wa.get_future().get(), "");
  ASSERT_EQ(wb.get_future().get(), "");
  at::Tensor ra = at::empty_like(xa), rb = at::empty_like(xb);
  EXPECT_EQ(a.read(ia, ra.data_ptr(), ra.nbytes()), "");
  EXPECT_EQ(b.read(ib, rb.data_ptr(), rb.nbytes()), "");
  EXPECT_TRUE(at::equal(ra, xa));
  EXPECT_TRUE(at::equal(rb, xb));
  EXPECT_EQ(dir_.files(), 0) << "the files have no name";
}

int open_descriptors() {
  return static_cast<int>(std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                                        std::filesystem::directory_iterator{}));
}

// Each file holds a descriptor until remove(), which keeps it open for reuse; empty_cache() and the
// destructor (for the files in use and those kept) leave none open.
TEST_F(DiskHandleTest, EmptyCacheAndTheDestructorLeaveNoDescriptorOpen) {
  const int before = open_descriptors();
  for (const char* how : {"remove, empty_cache", "remove", "none"}) {
    DiskStore store(dir_.path(), 2);
    const int with_store = open_descriptors();
    std::vector<int64_t> ids;
    int64_t bytes = 0;
    for (int i = 0; i < 64; ++i) {
      ids.push_back(store.new_file(4096 * (i + 1)).id);
      bytes += 4096 * (i + 1);
    }
    EXPECT_EQ(open_descriptors(), with_store + 64) << how;
    if (std::string(how) == "none") continue;
    for (int64_t id : ids) store.remove(id);
    EXPECT_EQ(store.files_on_disk(), 0);
    EXPECT_EQ(store.bytes_cached(), bytes) << "every file kept for reuse";
    EXPECT_EQ(open_descriptors(), with_store + 64);
    if (std::string(how) == "remove") continue;
    store.empty_cache();
    EXPECT_EQ(store.bytes_cached(), 0);
    EXPECT_EQ(open_descriptors(), with_store);
  }
  EXPECT_EQ(open_descriptors(), before);
}

// A file of a size kept is reused (no new descriptor); a new file first closes kept ones until
// the files in use and those kept hold no more than the most the files in use ever held.
TEST_F(DiskHandleTest, KeptFilesAreReusedWithinTheMostTheFilesEverHeld) {
  DiskStore store(dir_.path(), 1);
  const size_t a = 1 << 20;
  const int64_t first = store.new_file(a).id, second = store.new_file(a).id;
  store.remove(first);
  store.remove(second);
  EXPECT_EQ(store.bytes_cached(), static_cast<int64_t>(2 * a));
  const int kept = open_descriptors();
  const int64_t again = store.new_file(a).id;
  EXPECT_EQ(open_descriptors(), kept) << "a kept file was reused";
  EXPECT_EQ(store.bytes_cached(), static_cast<int64_t>(a));
  // In use a, kept a, the most ever 2a: a new file of a / 2 needs the kept one closed.
  const int64_t smaller = store.new_file(a / 2).id;
  EXPECT_EQ(store.bytes_cached(), 0);
  EXPECT_EQ(open_descriptors(), kept);
  store.remove(again);
  store.remove(smaller);
  EXPECT_EQ(store.bytes_cached(), static_cast<int64_t>(a + a / 2));
}

// A reused file holds the previous tensor's bytes until its write: a second step's restores give
// the second step's tensors, through the files the first step freed.
TEST_F(DiskHandleTest, ASecondStepReusesTheFirstStepsFilesAndRestoresItsOwnData) {
  ManagerConfig config = config_for(TierKind::kDisk, dir_.path());
  auto manager = Manager::create(config);
  const int64_t n = 1 << 16, file_bytes = n * 4;
  {
    auto [xs, hs] = save_values(*manager, 4, n);
    for (int i = 3; i >= 0; --i) EXPECT_TRUE(at::equal(manager->restore(hs[i], kCPU), xs[i]));
  }
  manager->synchronize();
  EXPECT_EQ(manager->stats().disk_bytes_cached, 4 * file_bytes);
  const int descriptors = open_descriptors();
  std::vector<at::Tensor> xs, hs;
  for (int i = 0; i < 4; ++i) {
    xs.push_back(values(n, 100 + i));
    hs.push_back(manager->save(xs.back()));
  }
  manager->synchronize();
  EXPECT_EQ(manager->stats().disk_bytes_cached, 0) << "every file reused";
  EXPECT_EQ(open_descriptors(), descriptors);
  for (int i = 3; i >= 0; --i) EXPECT_TRUE(at::equal(manager->restore(hs[i], kCPU), xs[i])) << i;
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(at::equal(hs[i], xs[i])) << "the handle reads as its data";
  hs.clear();
  manager->empty_pool();
  EXPECT_EQ(manager->stats().disk_bytes_cached, 0);
}

// Kept files hold disk space: a new file that finds the disk full closes them and tries again.
TEST_F(DiskHandleTest, ANewFileOnAFullDiskClosesTheKeptFilesAndTriesAgain) {
  DiskStore store(dir_.path(), 1);
  const int64_t first = store.new_file(1 << 20).id, second = store.new_file(1 << 20).id;
  store.remove(first);
  store.remove(second);
  inject_fault(FaultSite::kDiskReserve, 0, 1);
  const int64_t id = store.new_file(1 << 19).id;  // within the bound: one kept file stays, then
  EXPECT_EQ(store.bytes_cached(), 0);             // the full disk closes it
  EXPECT_EQ(store.files_on_disk(), 1);
  store.remove(id);
  EXPECT_EQ(store.bytes_cached(), 1 << 19);
  inject_fault(FaultSite::kDiskReserve, 0, 2);  // full again after the kept file is closed
  EXPECT_NE(error_of([&] { store.new_file(1 << 18); }).find("cannot reserve 262144 bytes"),
            std::string::npos);
  EXPECT_EQ(store.bytes_cached(), 0);
  EXPECT_EQ(store.files_on_disk(), 0);
}

// Where the filesystem has no O_TMPFILE: random names in a private 0700 directory, unlinked as soon
// as they are open, the directory removed with the store.
TEST_F(DiskHandleTest, WithoutOTmpfileFilesLiveUnnamedInAPrivateDirectory) {
  inject_fault(FaultSite::kDiskNoTmpfile, 0, 1 << 30);
  {
    auto manager = Manager::create(config_for(TierKind::kDisk, dir_.path()));
    const at::Tensor x = values(5000, 7), y = values(5000, 8);
    const at::Tensor hx = manager->save(x), hy = manager->save(y);
    manager->synchronize();
    EXPECT_EQ(manager->stats().disk_files, 2);
    EXPECT_EQ(dir_.files(), 0) << "a file kept its name";
    int private_dirs = 0;
    for (auto& e : std::filesystem::directory_iterator(dir_.path())) {
      ASSERT_TRUE(e.is_directory());
      EXPECT_EQ(e.status().permissions() & std::filesystem::perms::all,
                std::filesystem::perms::owner_all);
      private_dirs++;
    }
    EXPECT_EQ(private_dirs, 1);
    EXPECT_TRUE(at::equal(manager->restore(hy, kCPU), y));
    EXPECT_TRUE(at::equal(manager->restore(hx, kCPU), x));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_.path())) << "the private directory was left behind";
}

// A half-built DiskStore used to destroy a joinable std::thread: std::terminate.
TEST_F(DiskHandleTest, AnIoThreadThatCannotStartIsAClearError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        inject_fault(FaultSite::kIoThreadStart, /*skip=*/1, /*times=*/1);
        try {
          DiskStore store(dir_.path(), 3);
        } catch (const c10::Error& e) {
          const bool named = std::string(e.what()).find("cannot start") != std::string::npos;
          std::exit(named ? 0 : 3);
        }
        std::exit(4);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EQ(dir_.files(), 0);
}

// A NUL inside disk_dir used to cut the path there: the files went to the directory named by the
// part before it. Refused, naming disk_dir, before anything is created.
TEST_F(DiskHandleTest, ANulCharacterInDiskDirIsRefused) {
  const std::string inside = dir_.path() + "/tier";
  for (const bool disk_only : {true, false}) {
    ManagerConfig config = config_for(disk_only ? TierKind::kDisk : TierKind::kSpill, inside);
    config.disk_dir = inside + std::string(1, '\0') + "more";
    const std::string error = error_of([&] { Manager::create(config); });
    EXPECT_NE(error.find("disk_dir contains a NUL character at position " +
                         std::to_string(inside.size())),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("after '" + inside + "'"), std::string::npos) << error;
    EXPECT_FALSE(std::filesystem::exists(inside)) << "the path was cut at the NUL and used";
  }
}

}  // namespace
}  // namespace torch_offload
