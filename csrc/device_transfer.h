#pragma once
// Asynchronous copies between a device and host memory, on side streams, ordered against the
// compute stream with fences. The manager only talks to this interface; the CUDA implementation
// lives in cuda_transfer.cpp, and tests substitute a CPU implementation with controllable fences.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <memory>
#include <utility>
#include <vector>

namespace torch_offload {

// Completion marker of work queued on a stream (a CUDA event on GPUs).
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  virtual bool query() = 0;        // true once the work is complete
  virtual void synchronize() = 0;  // blocks the calling host thread until complete
};
using FencePtr = std::shared_ptr<CopyFence>;

class DeviceTransfer {
 public:
  virtual ~DeviceTransfer() = default;
  // Queues host `dst` <- device `src` (both contiguous, same bytes) on the device-to-host stream,
  // after the work the compute stream has queued so far (which produces `src`).
  virtual FencePtr copy_to_host(const at::Tensor& src, const at::Tensor& dst) = 0;
  // Queues every host `second` <- device `first` of `copies` (all on `producer`'s device) on the
  // device-to-host stream after the work `producer` has queued so far, which produces the sources;
  // one fence completes with them all. Fewer calls than one copy_to_host each: the manager issues
  // a selected module call's copies together (Manager::begin_batch).
  virtual FencePtr copy_to_host_batch(const std::vector<std::pair<at::Tensor, at::Tensor>>& copies,
                                      c10::Stream producer) = 0;
  // Allocates the result on `device`'s compute stream (memory from a side stream's pool would stay
  // there) and queues result <- `host` on the host-to-device stream after `ready` (the D2H fence).
  virtual std::pair<at::Tensor, FencePtr> copy_to_device(const at::Tensor& host, c10::Device device,
                                                         const FencePtr& ready) = 0;
  // Makes `device`'s compute stream wait for `fence` without blocking the host.
  virtual void compute_waits_for(const FencePtr& fence, c10::Device device) = 0;
  // Milliseconds the compute streams have spent stalled in compute_waits_for so far.
  virtual double compute_wait_ms() = 0;
  virtual void reset_compute_wait() = 0;
};

}  // namespace torch_offload
