#include "disk_store.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "fault_injection.h"

namespace torch_offload {
namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)); }

// Full-buffer write/read loops: the kernel may transfer fewer bytes than asked.
std::string write_file(const std::string& path, const void* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot create " + path + ": " + errno_text(errno);
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(path.c_str());
      return "writing " + std::to_string(size) + " bytes to " + path +
             " failed: " + errno_text(err);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return "closing " + path + " failed: " + errno_text(err);
  }
  return "";
}

std::string read_file(const std::string& path, void* data, size_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open " + path + ": " + errno_text(errno);
  char* p = static_cast<char*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t n = ::read(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return "reading " + path + " failed: " + (n < 0 ? errno_text(errno) : "file is truncated");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  ::close(fd);
  return "";
}

std::atomic<int64_t> store_counter{0};

}  // namespace

DiskStore::DiskStore(const std::string& directory, int io_threads)
    : directory_(directory),
      prefix_("torch_offload_" + std::to_string(::getpid()) + "_" +
              std::to_string(store_counter++) + "_") {
  TORCH_CHECK(!directory_.empty(), "torch_offload: the disk tier needs a directory (disk_dir)");
  if (::mkdir(directory_.c_str(), 0700) != 0 && errno != EEXIST) {
    TORCH_CHECK(false, "torch_offload: cannot create disk_dir ", directory_, ": ",
                errno_text(errno));
  }
  const std::string probe = directory_ + "/" + prefix_ + "probe";
  const char byte = 0;
  const std::string error = write_file(probe, &byte, 1);
  ::unlink(probe.c_str());
  TORCH_CHECK(error.empty(), "torch_offload: disk_dir ", directory_, " is not writable: ", error);
  TORCH_CHECK(io_threads >= 1, "torch_offload: need at least one IO thread");
  try {
    for (int i = 0; i < io_threads; ++i) {
      if (fault_injected(FaultSite::kIoThreadStart)) {
        throw std::system_error(EAGAIN, std::generic_category(), "injected by a test");
      }
      threads_.emplace_back([this] { run(); });
    }
  } catch (const std::exception& e) {
    stop_threads();  // a joinable std::thread must not be destroyed
    TORCH_CHECK(false, "torch_offload: cannot start the disk tier's IO thread ",
                threads_.size() + 1, " of ", io_threads, ": ", e.what());
  }
}

void DiskStore::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : threads_) t.join();
}

DiskStore::~DiskStore() {
  stop_threads();
  for (int64_t id : files_) ::unlink(path_of(id).c_str());
}

std::string DiskStore::path_of(int64_t id) const {
  return directory_ + "/" + prefix_ + std::to_string(id) + ".bin";
}

int64_t DiskStore::new_file() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t id = next_id_++;
  files_.insert(id);
  return id;
}

void DiskStore::write_async(int64_t id, std::function<void()> ready, const void* data, size_t size,
                            Done done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back([this, id, ready = std::move(ready), data, size, done = std::move(done)] {
      ready();
      bool full;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        full = simulate_full_;
      }
      std::string error = full ? "writing " + std::to_string(size) + " bytes to " + path_of(id) +
                                     " failed: " + errno_text(ENOSPC)
                               : write_file(path_of(id), data, size);
      if (error.empty()) {
        std::lock_guard<std::mutex> lock(mutex_);
        bytes_written_ += static_cast<int64_t>(size);
      }
      done(error);
    });
  }
  work_ready_.notify_one();
}

void DiskStore::read_async(int64_t id, void* data, size_t size, Done done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back([this, id, data, size, done = std::move(done)] {
      std::string error = read_file(path_of(id), data, size);
      if (error.empty()) {
        std::lock_guard<std::mutex> lock(mutex_);
        bytes_read_ += static_cast<int64_t>(size);
      }
      done(error);
    });
  }
  work_ready_.notify_one();
}

std::string DiskStore::read(int64_t id, void* data, size_t size) {
  std::string error = read_file(path_of(id), data, size);
  if (error.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_read_ += static_cast<int64_t>(size);
  }
  return error;
}

void DiskStore::remove(int64_t id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    files_.erase(id);
  }
  ::unlink(path_of(id).c_str());
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

int64_t DiskStore::bytes_written() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_written_;
}

int64_t DiskStore::bytes_read() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_read_;
}

void DiskStore::simulate_full_disk(bool full) {
  std::lock_guard<std::mutex> lock(mutex_);
  simulate_full_ = full;
}

}  // namespace torch_offload
