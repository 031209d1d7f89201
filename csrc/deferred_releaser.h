#pragma once
// Keeps memory alive until the asynchronous copy that uses it has finished, then lets it go.
// This is how we avoid record_stream (which delays reuse and inflates reserved GPU memory): the GPU
// source of a device-to-host copy, and a pinned buffer an in-flight copy still reads or writes, are
// held here and dropped on a background thread as soon as the copy's completion fence is reached.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace torch_offload {

class DeferredReleaser {
 public:
  using Fence = std::function<void()>;    // blocks until the guarding device work completed
  using Payload = std::function<void()>;  // drops references / returns buffers

  // Starts the thread; a clear error where the system cannot start one (thread_start.h).
  DeferredReleaser();
  ~DeferredReleaser();  // waits for every fence and runs every payload
  DeferredReleaser(const DeferredReleaser&) = delete;
  DeferredReleaser& operator=(const DeferredReleaser&) = delete;

  // Runs `payload` once `fence` returns. The item stands for `copies_in_flight` copies in flight
  // (0: none; a batch of copies sharing one fence: several), the quantity wait_in_flight_below
  // bounds.
  void release_after(Fence fence, Payload payload, int64_t copies_in_flight);

  // Blocks the caller until fewer than `limit` counted items are pending; returns milliseconds
  // waited.
  double wait_in_flight_below(int64_t limit);
  // Blocks until every pending item has been released.
  void drain();

  int64_t in_flight() const;
  int64_t in_flight_peak() const;
  void reset_peak();

 private:
  struct Item {
    Fence fence;
    Payload payload;
    int64_t copies_in_flight;
  };
  void run();

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable progress_;
  std::deque<Item> queue_;
  int64_t in_flight_ = 0;
  int64_t in_flight_peak_ = 0;
  bool busy_ = false;  // the worker holds an item popped from the queue
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace torch_offload
