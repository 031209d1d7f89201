#include "cuda_transfer.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "compute_wait_timer.h"

namespace torch_offload {
namespace {

class CudaFence final : public CopyFence {
 public:
  bool query() override { return event.query(); }
  void synchronize() override { event.synchronize(); }
  // Timing disabled: the cheapest kind. (Blocking-sync events, which let waiting threads sleep,
  // made each save and restore slower on an H100: docs/performance.md.)
  at::cuda::CUDAEvent event{cudaEventDisableTiming};
};

// Creating and destroying a CUDA event are driver calls, two per copy: copies take their fences
// from a pool per device instead (events stay created and are recorded again; a stream wait takes
// the state of the event at the time of the call, so a recorded event can be reused at once). A
// fence goes back to the pool when its last holder drops it, on whatever thread.
class FencePool : public std::enable_shared_from_this<FencePool> {
 public:
  std::shared_ptr<CudaFence> take() {
    std::unique_ptr<CudaFence> fence;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        fence = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!fence) fence = std::make_unique<CudaFence>();
    std::shared_ptr<FencePool> pool = shared_from_this();
    return std::shared_ptr<CudaFence>(fence.release(),
                                      [pool](CudaFence* done) { pool->give_back(done); });
  }

 private:
  static constexpr size_t kMaxFree = 256;  // more than copies in flight plus live prefetches

  void give_back(CudaFence* done) {
    std::unique_ptr<CudaFence> owned(done);
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < kMaxFree) free_.push_back(std::move(owned));
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<CudaFence>> free_;
};

// Orders a side stream after the work queued so far on `stream`: one event per thread and
// device, recorded and waited on at once, so no other thread can record it in between.
void side_stream_waits_for(const c10::cuda::CUDAStream& stream, const c10::cuda::CUDAStream& side) {
  thread_local std::unordered_map<c10::DeviceIndex, at::cuda::CUDAEvent> events;
  at::cuda::CUDAEvent& event = events[stream.device_index()];
  event.record(stream);
  event.block(side);
}

// The same after the compute (current) stream.
void side_stream_waits_for_compute(c10::DeviceIndex index, const c10::cuda::CUDAStream& side) {
  side_stream_waits_for(at::cuda::getCurrentCUDAStream(index), side);
}

// The copies of a batch, in one driver call where the runtime has one (CUDA 13's
// cudaMemcpyBatchAsync), else one cudaMemcpyAsync each. Why: inside a host-bound 4k "modules"
// step a copy's cudaMemcpyAsync took ~10 us of the forward's thread, and the batches' ends took
// 1.28 ms per step in one call each against 1.54 ms issued one by one (docs/performance.md). A
// runtime or driver that refuses the batched call is not asked again.
void issue_copies_to_host(const std::vector<std::pair<at::Tensor, at::Tensor>>& copies,
                          cudaStream_t stream) {
#if CUDART_VERSION >= 13000
  static std::atomic<bool> refused{false};
  if (copies.size() > 1 && !refused.load(std::memory_order_relaxed)) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    for (const auto& [src, dst] : copies) {
      dsts.push_back(dst.data_ptr());
      srcs.push_back(src.const_data_ptr());
      sizes.push_back(src.nbytes());
    }
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;  // sources made in stream order
    size_t first = 0;  // the attributes apply from the first copy on
    if (cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), copies.size(), &attributes,
                             &first, 1, stream) == cudaSuccess) {
      return;
    }
    (void)cudaGetLastError();  // refused: one by one from now on (which reports a real error)
    refused.store(true, std::memory_order_relaxed);
  }
#endif
  for (const auto& [src, dst] : copies) {
    C10_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(),
                                   cudaMemcpyDeviceToHost, stream));
  }
}

// cudaHostAlloc promises 256-byte alignment only: the driver packs small allocations into shared
// pages. The disk tier's direct IO needs page-aligned buffers, so a misaligned allocation is made
// again with a page of slack and handed out from its first page boundary.
class PinnedAllocator final : public HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    void* ptr = host_alloc(bytes);
    if (ptr == nullptr || page_aligned(ptr)) return ptr;
    C10_CUDA_CHECK(cudaFreeHost(ptr));
    void* raw = host_alloc(bytes + kPage);
    if (raw == nullptr) return nullptr;
    const uintptr_t start = (reinterpret_cast<uintptr_t>(raw) + kPage - 1) / kPage * kPage;
    void* aligned = reinterpret_cast<void*>(start);
    std::lock_guard<std::mutex> lock(mutex_);
    raw_of_aligned_[aligned] = raw;
    return aligned;
  }
  void release(void* ptr) override {
    void* raw = ptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = raw_of_aligned_.find(ptr);
      if (it != raw_of_aligned_.end()) {
        raw = it->second;
        raw_of_aligned_.erase(it);
      }
    }
    C10_CUDA_CHECK(cudaFreeHost(raw));
  }
  bool pinned() const override { return true; }

 private:
  static constexpr uintptr_t kPage = 4096;
  static bool page_aligned(void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kPage == 0; }
  static void* host_alloc(size_t bytes) {
    void* ptr = nullptr;
    if (cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
      return nullptr;
    }
    return ptr;
  }

  std::mutex mutex_;
  std::unordered_map<void*, void*> raw_of_aligned_;  // only the allocations that were re-made
};

class CudaTransfer final : public DeviceTransfer {
 public:
  FencePtr copy_to_host(const at::Tensor& src, const at::Tensor& dst) override {
    const c10::DeviceIndex index = src.device().index();
    c10::cuda::CUDAGuard guard(index);
    const Streams& streams = streams_for(index);
    side_stream_waits_for_compute(index, streams.to_host);  // the work that produces src
    C10_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(),
                                   cudaMemcpyDeviceToHost, streams.to_host.stream()));
    std::shared_ptr<CudaFence> done = streams.fences->take();
    done->event.record(streams.to_host);
    return done;
  }

  FencePtr copy_to_host_batch(const std::vector<std::pair<at::Tensor, at::Tensor>>& copies,
                              c10::Stream producer) override {
    const c10::DeviceIndex index = producer.device_index();
    c10::cuda::CUDAGuard guard(index);
    const Streams& streams = streams_for(index);
    side_stream_waits_for(c10::cuda::CUDAStream(producer), streams.to_host);
    try {
      issue_copies_to_host(copies, streams.to_host.stream());
    } catch (...) {
      // The copies queued before the failing one would still run with no fence to tell when:
      // let them finish, so the caller may free their memory.
      (void)cudaStreamSynchronize(streams.to_host.stream());
      (void)cudaGetLastError();
      throw;
    }
    std::shared_ptr<CudaFence> done = streams.fences->take();
    done->event.record(streams.to_host);
    return done;
  }

  std::pair<at::Tensor, FencePtr> copy_to_device(const at::Tensor& host, c10::Device device,
                                                 const FencePtr& ready) override {
    const c10::DeviceIndex index =
        device.has_index() ? device.index() : c10::cuda::current_device();
    c10::cuda::CUDAGuard guard(index);
    const Streams& streams = streams_for(index);
    // Allocated while the compute stream is current: the block belongs to the compute stream's
    // pool, so freeing it later needs no record_stream.
    at::Tensor out = at::empty(
        host.sizes(), host.options().device(c10::Device(c10::kCUDA, index)).pinned_memory(false));
    side_stream_waits_for_compute(index, streams.to_device);  // the allocation of out
    if (ready) static_cast<CudaFence&>(*ready).event.block(streams.to_device);
    C10_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), host.data_ptr(), host.nbytes(),
                                   cudaMemcpyHostToDevice, streams.to_device.stream()));
    std::shared_ptr<CudaFence> done = streams.fences->take();
    done->event.record(streams.to_device);
    return {out, done};
  }

  void compute_waits_for(const FencePtr& fence, c10::Device device) override {
    auto& cuda_fence = static_cast<CudaFence&>(*fence);
    if (cuda_fence.event.query()) return;  // already complete: no stall to wait for or count
    const c10::DeviceIndex index =
        device.has_index() ? device.index() : c10::cuda::current_device();
    c10::cuda::CUDAGuard guard(index);
    wait_timer_.wait(at::cuda::getCurrentCUDAStream(index), cuda_fence.event);
  }

  double compute_wait_ms() override { return wait_timer_.waited_ms(); }

  void reset_compute_wait() override { wait_timer_.reset(); }

 private:
  struct Streams {
    c10::cuda::CUDAStream to_host;
    c10::cuda::CUDAStream to_device;
    std::shared_ptr<FencePool> fences;  // events are tied to their device
  };

  const Streams& streams_for(c10::DeviceIndex index) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(index);
    if (it == streams_.end()) {
      // Two streams so that restores in backward never queue behind offloads still in flight.
      it = streams_
               .emplace(index, Streams{c10::cuda::getStreamFromPool(false, index),
                                       c10::cuda::getStreamFromPool(false, index),
                                       std::make_shared<FencePool>()})
               .first;
    }
    return it->second;
  }

  std::mutex mutex_;
  std::unordered_map<c10::DeviceIndex, Streams> streams_;
  ComputeWaitTimer wait_timer_;
};

bool cuda_device_present() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

}  // namespace

std::unique_ptr<DeviceTransfer> make_cuda_transfer() {
  if (!cuda_device_present()) return nullptr;
  return std::make_unique<CudaTransfer>();
}

std::unique_ptr<HostAllocator> make_pinned_allocator() {
  if (!cuda_device_present()) return nullptr;
  return std::make_unique<PinnedAllocator>();
}

}  // namespace torch_offload
