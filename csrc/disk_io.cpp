#include "disk_io.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace torch_offload {

std::string errno_text(int err) { return std::string(std::strerror(err)); }

bool is_full(int err) { return err == ENOSPC || err == EDQUOT; }

bool set_direct(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT) == 0;
}

int pwrite_all(int fd, const void* data, size_t length) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < length) {
    const ssize_t n = ::pwrite(fd, p + done, length - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : ENOSPC;
    done += static_cast<size_t>(n);
  }
  return 0;
}

std::string pread_all(int fd, char* data, size_t done, size_t length) {
  while (done < length) {
    const ssize_t n = ::pread(fd, data + done, length - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno_text(errno) : "the file is truncated";
    done += static_cast<size_t>(n);
  }
  return "";
}

size_t read_cached_prefix(int fd, char* data, size_t size, bool* known) {
  if (size == 0) return 0;
  struct iovec iov {
    data, size
  };
  ssize_t n;
  do {
    n = ::preadv2(fd, &iov, 1, 0, RWF_NOWAIT);
  } while (n < 0 && errno == EINTR);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno != EAGAIN) *known = false;
  return 0;
}

}  // namespace torch_offload
