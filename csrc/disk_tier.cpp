#include "disk_tier.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cstring>
#include <optional>

#include "elapsed.h"

namespace torch_offload {

// One tensor's file. Its state is guarded by the tier's mutex; IO callbacks hold a reference, so
// the record outlives every IO it queued.
class DiskStored : public StoredTensor, public std::enable_shared_from_this<DiskStored> {
 public:
  DiskStored(DiskTier& tier, HostBlock staging, size_t nbytes, int64_t sequence)
      : tier_(tier),
        file_(tier.create_file(nbytes)),
        nbytes_(nbytes),
        sequence_(sequence),
        staging_(staging) {}

  void* destination() override { return staging_->ptr; }
  void* handle_data() override { return file_.data; }
  bool views_restore_as_copies() const override { return false; }
  // A finished read-ahead's bytes: the manager copies them to the device ahead of the restore
  // (else each restore's copy would stall the compute stream).
  const void* resident() override {
    std::lock_guard<std::mutex> lock(tier_.mutex_);
    return read_block_ && !read_pending_ && read_error_.empty() ? read_block_->ptr : nullptr;
  }

  void commit(FencePtr landed) override {
    {
      std::lock_guard<std::mutex> lock(tier_.mutex_);
      committed_ = true;
    }
    auto self = shared_from_this();
    tier_.store_->write_async(
        file_.id,
        [landed] {
          if (landed) landed->synchronize();
        },
        staging_->ptr, nbytes_,
        [self](const std::string& error, bool disk_full) { self->written(error, disk_full); });
  }

  void read_ahead() override {
    std::lock_guard<std::mutex> lock(tier_.mutex_);
    if (write_pending_ || staging_ || read_pending_ || read_block_) return;
    try {
      read_block_ = tier_.acquire_staging(nbytes_, FaultSite::kDiskReadAheadStaging);
    } catch (const std::exception&) {
      return;  // no memory for it now: the restore reads the file itself
    }
    read_pending_ = true;
    read_error_.clear();
    tier_.pending_reads_++;
    auto self = shared_from_this();
    tier_.store_->read_async(file_.id, read_block_->ptr, nbytes_,
                             [self](const std::string& error, bool) { self->read_done(error); });
  }

  HostBytes bytes_for_restore() override {
    const auto start = std::chrono::steady_clock::now();
    HostBytes bytes = wait_for_bytes();
    const double waited = ms_since(start);
    std::lock_guard<std::mutex> lock(tier_.mutex_);
    tier_.read_wait_ms_ += waited;
    return bytes;
  }

  std::function<void()> release() override {
    std::vector<HostBlock> blocks;
    {
      std::unique_lock<std::mutex> lock(tier_.mutex_);
      tier_.io_done_.wait(lock, [&] { return (!committed_ || !write_pending_) && !read_pending_; });
      if (!committed_) {  // the save failed before its write was queued
        tier_.pending_writes_--;
        tier_.io_done_.notify_all();
      }
      if (staging_ && readers_ > 0) {
        released_ = true;  // the last restore still reading staging_ frees it
      } else {
        if (staging_) blocks.push_back(*staging_);
        staging_.reset();
      }
      if (read_block_) blocks.push_back(*read_block_);
      read_block_.reset();
    }
    tier_.close_file(file_.id);
    return [pool = tier_.staging_pool_, blocks] {
      for (const HostBlock& b : blocks) pool->release(b);
    };
  }

 private:
  // The file's bytes in host memory, waiting for its write, its read-ahead or a read of its own.
  HostBytes wait_for_bytes() {
    std::unique_lock<std::mutex> lock(tier_.mutex_);
    // A file still being written is restored from the bytes its write reads (backward's first
    // restore usually comes before the newest write has finished).
    tier_.io_done_.wait(
        lock, [&] { return !read_pending_ && (!write_pending_ || (committed_ && staging_)); });
    if (staging_ && (write_pending_ || kept_)) {
      if (!write_pending_ && readers_ == 0) {  // the newest file, kept: this restore takes it
        const HostBlock block = *staging_;
        staging_.reset();
        kept_ = false;
        return HostBytes{block.ptr, give_back(block), false};
      }
      readers_++;  // shares staging_ with the write (or another restore) until its copy is done
      return HostBytes{staging_->ptr, [self = shared_from_this()] { self->reader_done(); }, false};
    }
    // The write failed: the data never left host memory, and stays there until release().
    if (staging_) return HostBytes{staging_->ptr, nullptr, false};
    if (read_block_) {
      // A read-ahead's buffer serves exactly one restore: take it out of the record.
      const HostBlock block = *read_block_;
      read_block_.reset();
      const bool ok = read_error_.empty();
      read_error_.clear();
      if (ok) return HostBytes{block.ptr, give_back(block), true};
      tier_.staging_pool_->release(block);  // read again below: the error may have been passing
    }
    lock.unlock();
    const HostBlock block = tier_.acquire_staging(nbytes_, FaultSite::kDiskRestoreStaging);
    const std::string error = tier_.store_->read(file_.id, block.ptr, nbytes_);
    if (!error.empty()) {
      tier_.staging_pool_->release(block);
      TORCH_CHECK(false,
                  "offload_restore: reading an offloaded tensor back from disk failed: ", error);
    }
    return HostBytes{block.ptr, give_back(block), false};
  }

  std::function<void()> give_back(HostBlock block) {
    return [pool = tier_.staging_pool_, block] { pool->release(block); };
  }

  void written(const std::string& error, bool disk_full) {
    // A failed write keeps the data in staging_ for restores; the handle (the file mapped
    // copy-on-write) must read as the tensor too: layer offloading makes it a parameter's data.
    // No lock needed: staging_ is only dropped once write_pending_ is false.
    if (!error.empty() && nbytes_ > 0) std::memcpy(file_.data, staging_->ptr, nbytes_);
    std::lock_guard<std::mutex> lock(tier_.mutex_);
    tier_.pending_writes_--;
    write_pending_ = false;
    if (error.empty()) {
      written_ok_ = true;
      keep_if_newest_locked();
    } else if (tier_.write_error_.empty()) {
      tier_.write_error_ = error;  // the data stays in staging_, so nothing is lost
      tier_.write_error_bytes_ = disk_full ? nbytes_ : 0;
    }
    tier_.io_done_.notify_all();
  }

  // Backward restores the newest save first, before any read-ahead could have started: the newest
  // written file's bytes stay in host memory (one staging buffer) until a newer file is written.
  void keep_if_newest_locked() {
    std::shared_ptr<DiskStored> kept = tier_.newest_kept_.lock();
    if (kept && kept->sequence_ > sequence_) {
      drop_staging_locked();  // a newer save's file was written first
      return;
    }
    if (kept) kept->drop_staging_locked();
    kept_ = true;
    tier_.newest_kept_ = shared_from_this();
  }

  // Frees staging_ once no restore reads it (else the last reader does).
  void drop_staging_locked() {
    kept_ = false;
    if (readers_ > 0) return;
    if (staging_) tier_.staging_pool_->release(*staging_);
    staging_.reset();
  }

  void reader_done() {
    std::lock_guard<std::mutex> lock(tier_.mutex_);
    readers_--;
    if (readers_ == 0 && (released_ || (written_ok_ && !kept_))) drop_staging_locked();
  }

  void read_done(const std::string& error) {
    std::lock_guard<std::mutex> lock(tier_.mutex_);
    tier_.pending_reads_--;
    read_pending_ = false;
    read_error_ = error;
    tier_.io_done_.notify_all();
  }

  DiskTier& tier_;
  const DiskStore::NewFile file_;
  const size_t nbytes_;
  const int64_t sequence_;  // save order
  // Guarded by tier_.mutex_.
  std::optional<HostBlock> staging_;     // the data until its write succeeded (or while kept_)
  bool kept_ = false;                    // written, and staging_ kept as the newest file's bytes
  bool written_ok_ = false;              // the file holds the bytes
  int readers_ = 0;                      // restores reading staging_ without owning it
  bool released_ = false;                // the handle is gone: the last reader frees staging_
  std::optional<HostBlock> read_block_;  // a read-ahead's buffer, until a restore takes it
  bool committed_ = false;
  bool write_pending_ = true;  // from reserve until the write ended
  bool read_pending_ = false;
  std::string read_error_;
};

DiskTier::DiskTier(const std::string& directory, int io_threads,
                   std::unique_ptr<HostAllocator> staging_allocator, DirectIo direct_io)
    : max_writes_in_flight_(io_threads),
      staging_pool_(std::make_shared<HostBufferPool>(std::move(staging_allocator), 0)),
      store_(std::make_unique<DiskStore>(directory, io_threads, direct_io)) {}

DiskTier::~DiskTier() = default;

HostBlock DiskTier::acquire_staging(size_t nbytes, FaultSite site) {
  TORCH_CHECK(!fault_injected(site),
              "torch_offload: out of host memory for a disk staging buffer of ", nbytes,
              " bytes (injected by a test)");
  return staging_pool_->acquire(store_->buffer_size(nbytes));
}

DiskStore::NewFile DiskTier::create_file(size_t nbytes) {
  const auto start = std::chrono::steady_clock::now();
  const DiskStore::NewFile file = store_->new_file(nbytes);
  const double took = ms_since(start);
  std::lock_guard<std::mutex> lock(mutex_);
  create_ms_ += took;
  return file;
}

// Unmaps the file, and closes it (the last close frees its pages in the page cache) or keeps it.
void DiskTier::close_file(int64_t id) {
  const auto start = std::chrono::steady_clock::now();
  store_->remove(id);
  const double took = ms_since(start);
  std::lock_guard<std::mutex> lock(mutex_);
  close_ms_ += took;
}

void DiskTier::check_before_save() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (write_error_.empty()) return;
  if (write_error_bytes_ > 0 && store_->has_room(write_error_bytes_)) {
    write_error_.clear();  // the disk was full, and space has been freed since: nothing to report
    return;
  }
  const std::string error = std::move(write_error_);
  write_error_.clear();
  TORCH_CHECK(false, "torch_offload: the disk tier failed: ", error,
              ". Tensors saved before stay in host memory and restore correctly; free space in "
              "disk_dir or choose another one. Nothing was offloaded by this call.");
}

std::shared_ptr<StoredTensor> DiskTier::reserve(size_t nbytes, bool /*may_decline*/) {
  int64_t sequence;
  {
    // Each write in flight holds a staging buffer and, once queued, an IO thread.
    std::unique_lock<std::mutex> lock(mutex_);
    const auto start = std::chrono::steady_clock::now();
    io_done_.wait(lock, [&] { return pending_writes_ < max_writes_in_flight_; });
    host_wait_ms_ += ms_since(start);
    pending_writes_++;
    sequence = next_sequence_++;
  }
  const auto undo = [this] {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_writes_--;
    io_done_.notify_all();
  };
  std::optional<HostBlock> staging;
  try {
    staging = acquire_staging(nbytes, FaultSite::kDiskWriteStaging);
    return std::make_shared<DiskStored>(*this, *staging, nbytes, sequence);
  } catch (...) {
    if (staging) staging_pool_->release(*staging);
    undo();
    throw;
  }
}

void DiskTier::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  io_done_.wait(lock, [this] { return pending_writes_ == 0 && pending_reads_ == 0; });
}

void DiskTier::add_stats(OffloadStats& s) {
  s.disk_files = store_->files_on_disk();
  s.disk_bytes_cached = store_->bytes_cached();
  s.disk_bytes_written = store_->bytes_written();
  s.disk_bytes_read = store_->bytes_read();
  s.disk_bytes_read_from_page_cache = store_->bytes_read_from_page_cache();
  s.disk_checksum_ms = store_->checksum_ms();
  s.disk_direct_io = store_->direct_io() ? 1 : store_->direct_io_when_ram_is_short() ? 2 : 0;
  s.disk_bytes_written_direct = store_->bytes_written_direct();
  std::lock_guard<std::mutex> lock(mutex_);
  s.host_wait_ms += host_wait_ms_;
  s.disk_read_wait_ms = read_wait_ms_;
  s.disk_create_ms = create_ms_;
  s.disk_close_ms = close_ms_;
}

void DiskTier::reset_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  host_wait_ms_ = 0.0;
  read_wait_ms_ = 0.0;
  create_ms_ = 0.0;
  close_ms_ = 0.0;
}

}  // namespace torch_offload
