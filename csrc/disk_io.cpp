#include "disk_io.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
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

int pwrite_all(int fd, const char* data, size_t done, size_t length) {
  while (done < length) {
    const ssize_t n = ::pwrite(fd, data + done, length - done, static_cast<off_t>(done));
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

size_t read_cached(int fd, char* data, size_t done, size_t length, bool* known) {
  if (done >= length) return 0;
  struct iovec iov {
    data + done, length - done
  };
  ssize_t n;
  do {
    n = ::preadv2(fd, &iov, 1, static_cast<off_t>(done), RWF_NOWAIT);
  } while (n < 0 && errno == EINTR);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno != EAGAIN) *known = false;
  return 0;
}

// Each live file holds a descriptor: let the process use as many as its hard limit allows.
void raise_open_file_limit() {
  static const bool raised = [] {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
      limit.rlim_cur = limit.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &limit);
    }
    return true;
  }();
  (void)raised;
}

// Opens `path` as a directory we may safely make files in: not a directory that another user
// owns and everyone may write to (they could swap what we create), unless it is sticky and
// root's (like /tmp).
int open_checked_directory(const std::string& path, const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "torch_offload: cannot open ", what, " ", path, ": ", errno_text(errno));
  struct stat st {};
  ::fstat(fd, &st);
  const bool foreign = st.st_uid != ::geteuid();
  const bool everyone_writes = (st.st_mode & S_IWOTH) != 0;
  const bool sticky_root = (st.st_mode & S_ISVTX) != 0 && st.st_uid == 0;
  if (foreign && everyone_writes && !sticky_root) {
    ::close(fd);
    TORCH_CHECK(false, "torch_offload: refusing ", what, " ", path, ": it belongs to user id ",
                st.st_uid,
                " and everyone may write to it, so another user could tamper with the "
                "offloaded tensors. Choose a directory of your own.");
  }
  return fd;
}

}  // namespace torch_offload
