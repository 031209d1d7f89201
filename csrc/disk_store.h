#pragma once
// Files for the disk tier: each offloaded tensor is one file in a directory, written and read by
// background IO threads. Files are removed when their tensor is released and, at the latest, when
// the store is destroyed (normal exit or unwinding after an exception).
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace torch_offload {

class DiskStore {
 public:
  // Creates `directory` if needed and checks that a file can be written there (throws otherwise).
  DiskStore(const std::string& directory, int io_threads);
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // Called on an IO thread once the operation ended; `error` is empty on success.
  using Done = std::function<void(const std::string& error)>;

  // Allocates a new file id (no IO yet).
  int64_t new_file();
  // After `ready()` returns, writes `size` bytes at `data` into file `id`.
  void write_async(int64_t id, std::function<void()> ready, const void* data, size_t size,
                   Done done);
  // Reads `size` bytes of file `id` into `data`.
  void read_async(int64_t id, void* data, size_t size, Done done);
  // Reads `size` bytes of file `id` into `data` on the calling thread; returns the error ("" if
  // none).
  std::string read(int64_t id, void* data, size_t size);
  // Deletes file `id` (no error if it was never written).
  void remove(int64_t id);

  const std::string& directory() const { return directory_; }
  int64_t files_on_disk() const;
  int64_t bytes_written() const;
  int64_t bytes_read() const;

  // Test hook: the next writes fail as if the disk were full.
  void simulate_full_disk(bool full);

 private:
  std::string path_of(int64_t id) const;
  void run();
  void stop_threads();

  const std::string directory_;
  const std::string prefix_;  // unique per store: pid and a counter
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::deque<std::function<void()>> queue_;
  std::unordered_set<int64_t> files_;  // written or being written
  int64_t next_id_ = 0;
  int64_t bytes_written_ = 0;
  int64_t bytes_read_ = 0;
  bool simulate_full_ = false;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace torch_offload
