#pragma once
// The disk tier: each saved tensor goes through a staging host buffer into a file of the
// DiskStore, written by its IO threads; read-ahead (backward prefetch) and restores read it back
// into staging buffers of their own; the newest written file's bytes also stay in memory, for the
// first restore of backward. The handle holds no data.
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "disk_store.h"
#include "fault_injection.h"
#include "host_buffer_pool.h"
#include "tier.h"

namespace torch_offload {

class DiskStored;

class DiskTier : public Tier {
 public:
  // Up to `io_threads` writes are in flight, one per IO thread (more would only wait in the
  // threads' queue), each holding its staging buffer; `direct_io`: which files bypass the page
  // cache, where the filesystem allows it (DiskStore).
  DiskTier(const std::string& directory, int io_threads,
           std::unique_ptr<HostAllocator> staging_allocator, DirectIo direct_io = DirectIo::kNever);
  ~DiskTier() override;

  void check_before_save() override;
  std::shared_ptr<StoredTensor> reserve(size_t nbytes, bool may_decline) override;
  void synchronize() override;
  void add_stats(OffloadStats& stats) override;
  void reset_stats() override;
  void empty_cache() override {
    staging_pool_->empty_cache();
    store_->empty_cache();
  }
  // Test hook: the next writes fail as if the disk were full.
  void simulate_full_disk(bool full) { store_->simulate_full_disk(full); }
  void simulate_available_ram(int64_t bytes) { store_->simulate_available_ram(bytes); }

 private:
  friend class DiskStored;
  // A staging buffer for a file of `nbytes` (padded for direct IO), failing at `site` when a test
  // injects a fault there.
  HostBlock acquire_staging(size_t nbytes, FaultSite site);
  // The store's new_file and remove, timed (disk_create_ms, disk_close_ms).
  DiskStore::NewFile create_file(size_t nbytes);
  void close_file(int64_t id);

  const int64_t max_writes_in_flight_;            // one per IO thread
  std::shared_ptr<HostBufferPool> staging_pool_;  // outside the host budget
  std::mutex mutex_;
  std::condition_variable io_done_;  // signalled with mutex_ when IO finishes
  int64_t pending_writes_ = 0;       // reserved and not yet written (each holds a staging buffer)
  int64_t pending_reads_ = 0;        // read-aheads under way
  std::string write_error_;          // first failed write, reported by the next save
  size_t write_error_bytes_ = 0;     // its size when it failed for lack of space
  double host_wait_ms_ = 0.0;        // saves blocked by the write bound
  double read_wait_ms_ = 0.0;        // restores blocked until their file's bytes were in memory
  double create_ms_ = 0.0;           // in create_file
  double close_ms_ = 0.0;            // in close_file
  int64_t next_sequence_ = 0;        // save order of the next reserve
  std::weak_ptr<DiskStored> newest_kept_;  // the newest written file, its bytes kept in memory
  // Last member: destroyed first, its IO threads finish every queued task (which lock mutex_).
  std::unique_ptr<DiskStore> store_;
};

}  // namespace torch_offload
