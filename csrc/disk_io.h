#pragma once
// Low-level file IO for the disk tier (DiskStore): opening its directory safely, the open-file
// limit, errno text, full-buffer pread/pwrite loops, switching O_DIRECT on and off, and reading
// what the page cache holds without waiting (RWF_NOWAIT).
#include <cstddef>
#include <string>

namespace torch_offload {

// Opens `path` as a directory we may safely make files in: not a directory that another user
// owns and everyone may write to (they could swap what we create), unless it is sticky and
// root's (like /tmp). Throws a clear error naming `what` (e.g. "disk_dir").
int open_checked_directory(const std::string& path, const char* what);
// Each live file holds a descriptor: lets the process use as many as its hard limit allows.
void raise_open_file_limit();

std::string errno_text(int err);

// Whether `err` (an errno value) means the disk, or the user's quota, is full.
bool is_full(int err);

// Switches O_DIRECT on or off for `fd`; false where the filesystem refuses.
bool set_direct(int fd, bool on);

// Full-buffer write/read loops over bytes [done, length) of `fd` and of the buffer `data` that
// mirrors the file: the kernel may transfer fewer bytes than asked.
// Returns 0, or the errno value of the failure (ENOSPC where the kernel wrote nothing).
int pwrite_all(int fd, const char* data, size_t done, size_t length);
// Returns "" or why not.
std::string pread_all(int fd, char* data, size_t done, size_t length);

// Reads what the page cache holds from byte `done` on, up to `length`, without waiting for the
// disk (RWF_NOWAIT); returns the number of bytes read: the traffic the page cache served. Where
// the kernel or filesystem cannot tell (older kernels, some sandboxes), sets `*known` false: the
// share is reported unknown.
size_t read_cached(int fd, char* data, size_t done, size_t length, bool* known);

}  // namespace torch_offload
