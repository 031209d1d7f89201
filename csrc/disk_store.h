#pragma once
// Files for the disk tier: each offloaded tensor is one file, written and read by background IO
// threads (reads on restore also run on the caller). The files have no name (O_TMPFILE; or, where
// the filesystem lacks it, a random name in a private 0700 subdirectory, unlinked right after it
// is created): no other process can open, replace or plant them, two stores sharing a directory
// never see each other's files, and nothing is left behind however the process ends. Each file's
// CRC32C is checked on every read.
// With direct IO (O_DIRECT) the bytes go between the caller's buffer and the disk without a copy
// in the page cache: for hosts whose RAM cannot hold what is offloaded, where the page cache would
// only add a copy and push other data out (every file, or per file when RAM is short:
// direct_io_policy.h). Transfers are then whole blocks of kDirectIoBlock bytes from memory aligned
// to it: buffers must hold buffer_size(size) bytes.
// Through the page cache, remove() keeps a file open for the next new_file of its size, as the host
// pool keeps its buffers: the last close of a file frees its pages in the page cache and a new file
// reserves its space again, work a step that saves every tensor to disk would do hundreds of times.
// The files kept and those in use never hold more bytes than the most the store's files held at
// once; empty_cache() closes those kept.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "crc32c.h"
#include "direct_io_policy.h"

namespace torch_offload {

class DiskStore {
 public:
  // Opens `directory` (created 0700 if missing) and checks that files can be made there. Refuses
  // a directory that another user owns and everyone may write to. Throws a clear error.
  // With `direct_io` other than kNever, files are read and written with O_DIRECT where the
  // filesystem allows it (elsewhere through the page cache, and direct_io() says so).
  DiskStore(const std::string& directory, int io_threads, DirectIo direct_io = DirectIo::kNever);
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // Called on an IO thread once the operation ended; `error` is empty on success, `disk_full`
  // tells a write that failed for lack of space.
  using Done = std::function<void(const std::string& error, bool disk_full)>;

  struct NewFile {
    int64_t id;
    // The file mapped copy-on-write (writes to it never reach the file): it shows the file's
    // bytes once their write finished. Valid until remove(id).
    void* data;
  };
  static constexpr size_t kDirectIoBlock = 4096;

  // A new file of `size` bytes, its space reserved where the filesystem can (a full disk is an
  // error here, not at the write). Throws a clear error.
  NewFile new_file(size_t size);
  // After `ready()` returns, writes `size` bytes at `data` into file `id` (with direct IO,
  // buffer_size(size) bytes: the padding is written too).
  void write_async(int64_t id, std::function<void()> ready, const void* data, size_t size,
                   Done done);
  // Reads file `id` into `data` (`size` bytes; buffer_size(size) with direct IO) and checks its
  // checksum.
  void read_async(int64_t id, void* data, size_t size, Done done);
  // The same, on the calling thread; returns the error ("" if none).
  std::string read(int64_t id, void* data, size_t size);
  // Frees file `id`: closes it, or keeps it open for the next file of its size.
  void remove(int64_t id);
  // Closes the files remove() kept.
  void empty_cache();
  // Whether `bytes` more would fit on the filesystem now (a full disk may have been freed).
  bool has_room(size_t bytes) const;

  // Bytes a buffer passed to write_async / read for a file of `size` bytes must hold.
  size_t buffer_size(size_t size) const;
  // Whether every file is read and written around the page cache (asked for and supported).
  bool direct_io() const;
  // The files go around the page cache one by one, when RAM is short (asked for and supported).
  bool direct_io_when_ram_is_short() const;

  const std::string& directory() const { return directory_; }
  int64_t files_on_disk() const;
  int64_t bytes_cached() const;  // of the files remove() kept open for reuse
  int64_t bytes_written() const;
  int64_t bytes_written_direct() const;  // of bytes_written(), those written around the page cache
  int64_t bytes_read() const;
  // Of bytes_read(), those the page cache served; -1 where that cannot be known.
  int64_t bytes_read_from_page_cache() const;
  double checksum_ms() const;  // IO-thread time spent computing and verifying checksums

  // Test hook: the next writes fail as if the disk were full.
  void simulate_full_disk(bool full);
  // Test hook: the host's available RAM as DirectIo::kWhenRamIsShort sees it (-1: the real one).
  void simulate_available_ram(int64_t bytes) { policy_.simulate_available_ram(bytes); }

 private:
  struct File {
    int fd = -1;
    void* map = nullptr;
    size_t size = 0;                  // of the file (the mapping): whole blocks with direct IO
    bool direct = false;              // opened with O_DIRECT
    FileChecksum checksum{};          // of the bytes written
    int64_t policy_cached_bytes = 0;  // policy_ counts them in the page cache until remove()
  };
  int create_unnamed_file();
  NewFile new_file_as(size_t size, bool want_direct);
  NewFile add_file(const File& file);
  std::optional<NewFile> reuse_file(size_t size);
  void make_room_for(size_t size);
  bool direct_transfer(int64_t id, const void* data);
  std::string write_file(int64_t id, const void* data, size_t size, bool* full);
  std::string describe(int64_t id) const;
  void run();
  void stop_threads();
  void close_all();  // the destructor's work; safe to call twice

  const std::string directory_;
  int dir_fd_ = -1;
  int private_dir_fd_ = -1;                // only where O_TMPFILE is unsupported
  std::string private_dir_;                // its path
  std::vector<std::string> unlink_later_;  // names whose unlink failed, retried on remove()
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::deque<std::function<void()>> queue_;
  std::unordered_map<int64_t, File> files_;
  bool reuse_files_ = false;           // no file goes around the page cache (set once probed)
  std::multimap<size_t, int> cached_;  // file length -> descriptor of a file remove() kept
  int64_t cached_bytes_ = 0;
  int64_t live_bytes_ = 0;       // of files_
  int64_t live_bytes_peak_ = 0;  // the most files_ held at once: the bound of live + cached
  int64_t next_id_ = 0;
  int64_t bytes_written_ = 0;
  int64_t bytes_read_ = 0;
  int64_t bytes_read_cached_ = 0;
  bool page_cache_share_known_ = true;
  int64_t bytes_written_direct_ = 0;
  DirectIoPolicy policy_;
  bool direct_capable_ = false;  // the filesystem does O_DIRECT (probed once, by the constructor)
  double checksum_ms_ = 0.0;
  bool simulate_full_ = false;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace torch_offload
