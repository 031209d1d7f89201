#pragma once
// The device tensor a device-to-host copy reads (SourceSlot), and the sources whose copy finished,
// waiting to be dropped on a user thread (FinishedSources).
//
// A source is usually a tensor that Python handed us. Dropping the last C++ reference to a tensor
// (or storage) that has a Python object takes the GIL (TensorImpl::decref_pyobject). The releaser's
// worker must never do that: a thread holding the GIL may be waiting for the worker (a manager
// destroyed from Python joins it in its destructor: deadlock), and while the interpreter shuts
// down, a thread that takes the GIL is ended inside a noexcept destructor (abort). So the worker
// only moves a finished source here, and the manager drops them on the threads that call it
// (save, restore, finish_save, synchronize, stats, empty_pool, its destructor).
#include <ATen/core/Tensor.h>

#include <mutex>
#include <utility>
#include <vector>

namespace torch_offload {

// Whoever learns first that the copy can no longer read the source (the background releaser, or
// finish_save in stream order) takes it out.
class SourceSlot {
 public:
  explicit SourceSlot(at::Tensor t) : tensor_(std::move(t)) {}
  // The source, or an undefined tensor once taken.
  at::Tensor take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(tensor_, at::Tensor());
  }

 private:
  std::mutex mutex_;
  at::Tensor tensor_;
};

class FinishedSources {
 public:
  void add(at::Tensor source) {
    if (!source.defined()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    sources_.push_back(std::move(source));
  }
  // Drops them on the calling thread. Call it without holding another lock of ours: a drop may run
  // Python code, which may call back into the manager.
  void drop() {
    std::vector<at::Tensor> dropped;
    std::lock_guard<std::mutex> lock(mutex_);
    dropped.swap(sources_);
    // `dropped` dies after the lock guard (declared first): the drops run unlocked.
  }

 private:
  std::mutex mutex_;
  std::vector<at::Tensor> sources_;
};

}  // namespace torch_offload
