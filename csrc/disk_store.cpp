#include "disk_store.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "disk_io.h"
#include "elapsed.h"
#include "fault_injection.h"
#include "thread_start.h"

namespace torch_offload {
namespace {

size_t whole_blocks(size_t size) {
  const size_t block = DiskStore::kDirectIoBlock;
  return (size + block - 1) / block * block;
}

// Bytes a file of `size` bytes takes on disk and in each transfer: direct IO moves whole blocks
// (the padding is written and read, never restored).
size_t transfer_length(size_t size, bool direct) { return direct ? whole_blocks(size) : size; }

bool block_aligned(const void* data) {
  return reinterpret_cast<uintptr_t>(data) % DiskStore::kDirectIoBlock == 0;
}

// Adds one slice to `checksum` and its time to `*ms`: the checksum's cost is reported
// (checksum_ms), as it runs on the IO threads and delays each write's and read's completion.
void add_timed(FileChecksummer* checksum, const char* slice, size_t size, double* ms) {
  const auto start = std::chrono::steady_clock::now();
  checksum->add(slice, size);
  *ms += ms_since(start);
}

}  // namespace

DiskStore::DiskStore(const std::string& directory, int io_threads, DirectIo direct_io)
    : directory_(directory), policy_(direct_io) {
  TORCH_CHECK(!directory_.empty(), "torch_offload: the disk tier needs a directory (disk_dir)");
  // The system reads a path up to its first NUL: a longer string would name another directory.
  const size_t nul = directory_.find('\0');
  TORCH_CHECK(nul == std::string::npos,
              "torch_offload: disk_dir contains a NUL character at position ", nul, " (after '",
              directory_.substr(0, nul), "'): a path cannot contain one; pass the directory's path",
              " without it");
  TORCH_CHECK(io_threads >= 1, "torch_offload: need at least one IO thread");
  if (::mkdir(directory_.c_str(), 0700) != 0 && errno != EEXIST) {
    TORCH_CHECK(false, "torch_offload: cannot create disk_dir ", directory_, ": ",
                errno_text(errno));
  }
  dir_fd_ = open_checked_directory(directory_, "disk_dir");
  raise_open_file_limit();
  try {
    // Fails here, not at the first save, when nothing can be written; and asks the filesystem
    // whether it does direct IO (one answer for the store: its files share the filesystem).
    const NewFile probe = new_file_as(1, direct_io != DirectIo::kNever);
    direct_capable_ = files_.at(probe.id).direct;
    remove(probe.id);
    live_bytes_peak_ = 0;
    reuse_files_ = !direct_capable_ || direct_io == DirectIo::kNever;
  } catch (const c10::Error& e) {
    close_all();
    TORCH_CHECK(false, "torch_offload: disk_dir ", directory_,
                " is not writable: ", e.what_without_backtrace());
  }
  if (direct_io != DirectIo::kNever && !direct_capable_) {
    TORCH_WARN("torch_offload: the filesystem of disk_dir ", directory_,
               " does not do direct IO (O_DIRECT): the disk tier goes through the page cache");
  }
  // Reserved first: a started thread is never dropped by a failed reallocation (std::terminate).
  threads_.reserve(static_cast<size_t>(io_threads));
  try {
    for (int i = 0; i < io_threads; ++i) {
      threads_.push_back(start_thread("the disk tier's IO thread " + std::to_string(i + 1) +
                                          " of " + std::to_string(io_threads),
                                      FaultSite::kIoThreadStart, [this] { run(); }));
    }
  } catch (...) {
    close_all();  // joins the threads started: a joinable std::thread must not be destroyed
    throw;
  }
}

void DiskStore::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

DiskStore::~DiskStore() { close_all(); }

void DiskStore::close_all() {
  stop_threads();
  for (auto& [id, file] : files_) {
    if (file.map != nullptr) ::munmap(file.map, file.size);
    ::close(file.fd);
  }
  files_.clear();
  empty_cache();
  for (const std::string& name : unlink_later_) ::unlinkat(private_dir_fd_, name.c_str(), 0);
  unlink_later_.clear();
  if (private_dir_fd_ >= 0) {
    ::close(private_dir_fd_);
    ::rmdir(private_dir_.c_str());
    private_dir_fd_ = -1;
  }
  if (dir_fd_ >= 0) ::close(dir_fd_);
  dir_fd_ = -1;
}

int DiskStore::create_unnamed_file() {
  int fd = -1;
  if (fault_injected(FaultSite::kDiskNoTmpfile)) {
    errno = EOPNOTSUPP;
  } else {
    fd = ::openat(dir_fd_, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  // No O_TMPFILE on this filesystem: a random name in a directory only we can enter, unlinked
  // at once.
  std::lock_guard<std::mutex> lock(mutex_);
  if (private_dir_fd_ < 0) {
    std::string pattern = directory_ + "/torch_offload-XXXXXX";
    TORCH_CHECK(::mkdtemp(pattern.data()) != nullptr, "torch_offload: cannot create a private ",
                "directory in disk_dir ", directory_, ": ", errno_text(errno));
    private_dir_ = pattern;
    private_dir_fd_ = ::open(private_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st {};
    TORCH_CHECK(private_dir_fd_ >= 0 && ::fstat(private_dir_fd_, &st) == 0 &&
                    st.st_uid == ::geteuid() && (st.st_mode & 077) == 0,
                "torch_offload: the private directory ", private_dir_, " was tampered with");
  }
  static thread_local std::mt19937_64 random{std::random_device{}()};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string name = std::to_string(random());
    const int named = ::openat(private_dir_fd_, name.c_str(),
                               O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (named < 0 && errno == EEXIST) continue;
    if (named >= 0 && ::unlinkat(private_dir_fd_, name.c_str(), 0) != 0) {
      unlink_later_.push_back(name);
    }
    return named;
  }
  errno = EEXIST;
  return -1;
}

DiskStore::NewFile DiskStore::new_file(size_t size) {
  if (reuse_files_ && size > 0) {
    if (std::optional<NewFile> reused = reuse_file(size)) return *reused;
    make_room_for(size);
  }
  // The policy is asked only where the filesystem does direct IO; what it counts, it is told of.
  const auto bytes = static_cast<int64_t>(size);
  const bool asked = direct_capable_;
  const bool direct = asked && policy_.choose(bytes);
  NewFile made{};
  try {
    try {
      made = new_file_as(size, direct);
    } catch (const c10::Error&) {
      if (bytes_cached() == 0) throw;
      empty_cache();  // the kept files' space may be what the disk lacks
      made = new_file_as(size, direct);
    }
  } catch (...) {
    if (asked) policy_.file_closed(bytes, direct);
    throw;
  }
  if (asked && !direct) {
    std::lock_guard<std::mutex> lock(mutex_);
    files_.at(made.id).policy_cached_bytes = bytes;
  }
  return made;
}

DiskStore::NewFile DiskStore::new_file_as(size_t size, bool want_direct) {
  const int fd = create_unnamed_file();
  if (fd < 0) {
    const int err = errno;
    TORCH_CHECK(
        false, "torch_offload: cannot create a file in disk_dir ", directory_, ": ",
        errno_text(err),
        err == EMFILE ? " (each tensor on disk holds a file descriptor: raise ulimit -n)" : "");
  }
  const bool direct = want_direct && set_direct(fd, true);
  File file{fd, nullptr, transfer_length(size, direct), direct, {}};
  if (size > 0) {
    // Reserve the space now: a full disk is reported by this save, and is never stale.
    const auto bytes = static_cast<off_t>(file.size);
    int err = fault_injected(FaultSite::kDiskReserve) ? ENOSPC
              : ::fallocate(fd, 0, 0, bytes) == 0     ? 0
                                                      : errno;
    if (err == EOPNOTSUPP) err = ::ftruncate(fd, bytes) == 0 ? 0 : errno;
    void* map = err != 0 ? MAP_FAILED
                         : ::mmap(nullptr, file.size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      if (err == 0) err = errno;
      ::close(fd);
      TORCH_CHECK(false, "torch_offload: cannot reserve ", size, " bytes in disk_dir ", directory_,
                  ": ", errno_text(err));
    }
    file.map = map;
  }
  return add_file(file);
}

DiskStore::NewFile DiskStore::add_file(const File& file) {
  static char empty_file_data;
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t id = next_id_++;
  files_.emplace(id, file);
  live_bytes_ += static_cast<int64_t>(file.size);
  live_bytes_peak_ = std::max(live_bytes_peak_, live_bytes_);
  return NewFile{id, file.map != nullptr ? file.map : &empty_file_data};
}

// A kept file of exactly `size` bytes, mapped afresh (the old mapping's copied-on-write pages must
// not show); it holds the previous tensor's bytes until its write.
std::optional<DiskStore::NewFile> DiskStore::reuse_file(size_t size) {
  int fd;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cached_.find(size);
    if (it == cached_.end()) return std::nullopt;
    fd = it->second;
    cached_.erase(it);
    cached_bytes_ -= static_cast<int64_t>(size);
  }
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    ::close(fd);
    return std::nullopt;  // a new file instead
  }
  return add_file(File{fd, map, size, false, {}});
}

// Before a new file of `size` bytes: closes kept files (the largest first) until the files in use,
// the new one and those kept hold no more than the most the files in use ever held (or than the
// files in use and the new one).
void DiskStore::make_room_for(size_t size) {
  std::vector<int> closing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t in_use = live_bytes_ + static_cast<int64_t>(size);
    const int64_t bound = std::max(live_bytes_peak_, in_use);
    while (!cached_.empty() && in_use + cached_bytes_ > bound) {
      const auto largest = std::prev(cached_.end());
      cached_bytes_ -= static_cast<int64_t>(largest->first);
      closing.push_back(largest->second);
      cached_.erase(largest);
    }
  }
  for (int fd : closing) ::close(fd);
}

void DiskStore::empty_cache() {
  std::vector<int> closing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [size, fd] : cached_) closing.push_back(fd);
    cached_.clear();
    cached_bytes_ = 0;
  }
  for (int fd : closing) ::close(fd);
}

// Whole blocks whenever a file may go around the page cache: the staging buffer is sized before
// the file is made.
size_t DiskStore::buffer_size(size_t size) const {
  return direct_capable_ && policy_.mode() != DirectIo::kNever ? whole_blocks(size) : size;
}

bool DiskStore::direct_io() const { return direct_capable_ && policy_.mode() == DirectIo::kAlways; }

bool DiskStore::direct_io_when_ram_is_short() const {
  return direct_capable_ && policy_.mode() == DirectIo::kWhenRamIsShort;
}

// Whether a transfer of file `id` from or to `data` goes around the page cache. A buffer not
// aligned to a block cannot: the file goes through the page cache from then on.
bool DiskStore::direct_transfer(int64_t id, const void* data) {
  std::lock_guard<std::mutex> lock(mutex_);
  File& file = files_.at(id);
  if (file.direct && !block_aligned(data) && set_direct(file.fd, false)) file.direct = false;
  return file.direct;
}

std::string DiskStore::describe(int64_t id) const {
  return "disk-tier file " + std::to_string(id) + " (unnamed, in " + directory_ + ")";
}

// Through the page cache, each slice is checksummed right before it is written and right after it
// is read, while it sits in the CPU's cache, instead of the whole file in a pass of its own (1.05x
// `disk`'s tokens/s at 4k, docs/performance.md). Direct IO moves the whole file in one transfer:
// the device reads host memory itself, and smaller direct transfers would wait on the disk more
// often.
std::string DiskStore::write_file(int64_t id, const void* data, size_t size, bool* full) {
  const bool direct = direct_transfer(id, data);
  const size_t length = transfer_length(size, direct);  // the buffer holds the padding
  int fd;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fd = files_.at(id).fd;
    if (simulate_full_) {
      *full = true;
      return "writing " + std::to_string(size) + " bytes to " + describe(id) +
             " failed: " + errno_text(ENOSPC);
    }
  }
  const char* p = static_cast<const char*>(data);
  FileChecksummer checksum;
  double checksum_ms = 0;
  int err = 0;
  for (size_t done = 0; done < size && err == 0; done += kChecksumSlice) {
    const size_t end = std::min(size, done + kChecksumSlice);
    add_timed(&checksum, p + done, end - done, &checksum_ms);
    if (!direct) err = pwrite_all(fd, p, done, end);
  }
  if (direct && err == 0) err = pwrite_all(fd, p, 0, length);
  std::lock_guard<std::mutex> lock(mutex_);
  checksum_ms_ += checksum_ms;
  if (err != 0) {
    *full = is_full(err);
    return "writing " + std::to_string(size) + " bytes to " + describe(id) +
           " failed: " + errno_text(err);
  }
  files_.at(id).checksum = checksum.value();
  bytes_written_ += static_cast<int64_t>(size);
  if (direct) bytes_written_direct_ += static_cast<int64_t>(size);
  return "";
}

std::string DiskStore::read(int64_t id, void* data, size_t size) {
  int fd;
  FileChecksum expected;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const File& file = files_.at(id);
    fd = file.fd;
    expected = file.checksum;
  }
  char* p = static_cast<char*>(data);
  const bool direct = direct_transfer(id, data);
  std::string error = direct ? pread_all(fd, p, 0, transfer_length(size, true)) : "";
  FileChecksummer checksum;
  double checksum_ms = 0;
  size_t cached = 0;  // bytes the page cache served without waiting for the disk
  bool known = true;
  for (size_t done = 0; done < size && error.empty(); done += kChecksumSlice) {
    const size_t end = std::min(size, done + kChecksumSlice);
    if (!direct) {
      const size_t served = read_cached(fd, p, done, end, &known);
      cached += served;
      error = pread_all(fd, p, done + served, end);
      if (!error.empty()) break;
    }
    add_timed(&checksum, p + done, end - done, &checksum_ms);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  checksum_ms_ += checksum_ms;
  if (!known) page_cache_share_known_ = false;
  if (!error.empty()) return "reading " + describe(id) + " failed: " + error;
  if (checksum.value() != expected) {
    return "reading " + describe(id) + " failed: its " + std::to_string(size) +
           " bytes do not match the checksum written (CRC32C): the file was modified or the disk "
           "returned bad data";
  }
  bytes_read_ += static_cast<int64_t>(size);
  bytes_read_cached_ += static_cast<int64_t>(cached);
  return "";
}

void DiskStore::write_async(int64_t id, std::function<void()> ready, const void* data, size_t size,
                            Done done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back([this, id, ready = std::move(ready), data, size, done = std::move(done)] {
      ready();
      bool full = false;
      const std::string error = write_file(id, data, size, &full);
      done(error, full);
    });
  }
  work_ready_.notify_one();
}

void DiskStore::read_async(int64_t id, void* data, size_t size, Done done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(
        [this, id, data, size, done = std::move(done)] { done(read(id, data, size), false); });
  }
  work_ready_.notify_one();
}

void DiskStore::remove(int64_t id) {
  File file;
  bool keep = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = files_.find(id);
    if (it == files_.end()) return;
    file = it->second;
    files_.erase(it);
    const auto size = static_cast<int64_t>(file.size);
    live_bytes_ -= size;
    keep = reuse_files_ && !file.direct && size > 0 &&
           live_bytes_ + cached_bytes_ + size <= live_bytes_peak_;
    if (keep) {
      cached_.emplace(file.size, file.fd);
      cached_bytes_ += size;
    }
    // Names whose unlink failed earlier (fallback without O_TMPFILE): try again.
    for (auto name = unlink_later_.begin(); name != unlink_later_.end();) {
      const bool gone = ::unlinkat(private_dir_fd_, name->c_str(), 0) == 0 || errno == ENOENT;
      name = gone ? unlink_later_.erase(name) : name + 1;
    }
  }
  if (file.map != nullptr) ::munmap(file.map, file.size);
  if (!keep) ::close(file.fd);
  if (file.policy_cached_bytes > 0) policy_.file_closed(file.policy_cached_bytes, /*direct=*/false);
}

bool DiskStore::has_room(size_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (simulate_full_) return false;
  struct statvfs st {};
  if (::fstatvfs(dir_fd_, &st) != 0) return false;
  return static_cast<unsigned long long>(st.f_bavail) * st.f_frsize >= bytes;
}

void DiskStore::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    task = nullptr;
    lock.lock();
  }
}

int64_t DiskStore::files_on_disk() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(files_.size());
}

int64_t DiskStore::bytes_cached() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}

int64_t DiskStore::bytes_written() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_written_;
}

int64_t DiskStore::bytes_written_direct() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_written_direct_;
}

int64_t DiskStore::bytes_read() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_read_;
}

double DiskStore::checksum_ms() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return checksum_ms_;
}

int64_t DiskStore::bytes_read_from_page_cache() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return page_cache_share_known_ ? bytes_read_cached_ : -1;
}

void DiskStore::simulate_full_disk(bool full) {
  std::lock_guard<std::mutex> lock(mutex_);
  simulate_full_ = full;
}

}  // namespace torch_offload
