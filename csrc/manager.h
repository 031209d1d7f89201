#pragma once
// The offload engine behind one OffloadManager: saves tensors into pooled host buffers, restores
// them (from a prefetched copy when one is ready), bounds copies in flight and keeps statistics.
// Thread-safe: backward runs on autograd worker threads while the main thread may still save.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "deferred_releaser.h"
#include "device_transfer.h"
#include "host_buffer_pool.h"
#include "manager_config.h"
#include "offload_stats.h"

namespace torch_offload {

class Manager : public std::enable_shared_from_this<Manager> {
 public:
  // `transfer` replaces the CUDA transfer for every device, CPU included (tests use it to drive the
  // asynchronous paths on CPU). By default CUDA tensors use the CUDA transfer and pinned memory,
  // CPU tensors are copied synchronously into pageable memory.
  static std::shared_ptr<Manager> create(const ManagerConfig& config,
                                         std::shared_ptr<DeviceTransfer> transfer = nullptr,
                                         std::unique_ptr<HostAllocator> allocator = nullptr);
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // Starts copying `x` to host memory and returns the host tensor (the handle). The handle keeps the
  // host copy alive; `x` itself is released as soon as the copy has finished.
  at::Tensor save(const at::Tensor& x);
  // Returns the saved tensor on `device`, ready for use on the current (compute) stream.
  at::Tensor restore(const at::Tensor& handle, c10::Device device);

  OffloadStats stats();
  void reset_stats();
  // Blocks until every copy queued so far has completed and its memory was released.
  void synchronize();
  // Frees cached host buffers (buffers held by live handles stay).
  void empty_pool();

  int64_t id() const { return id_; }
  const ManagerConfig& config() const { return config_; }

 private:
  struct Entry {
    at::Tensor host_view;  // non-owning view of the handle's buffer (the handle owns it)
    c10::Device source_device{c10::kCPU};
    c10::VariableVersion version_counter;  // disabled unless the source had one
    uint32_t saved_version = 0;
    FencePtr to_host_done;  // null when the copy was synchronous
    FencePtr last_fence;    // latest queued copy that touches the buffer
    at::Tensor prefetched;  // device copy started ahead of the restore
    FencePtr prefetch_done;
    bool restored = false;
    std::list<const void*>::iterator order_pos;
  };

  Manager(const ManagerConfig& config, std::shared_ptr<DeviceTransfer> transfer,
          std::unique_ptr<HostAllocator> allocator);
  DeviceTransfer* transfer_for(c10::Device device) const;
  at::Tensor make_handle(const HostBlock& block, const at::Tensor& like);
  void on_handle_freed(const HostBlock& block);
  void check_unmodified(const Entry& entry) const;
  void prefetch_before_locked(const Entry& restored, c10::Device device, DeviceTransfer* transfer);

  const ManagerConfig config_;
  int64_t id_ = 0;
  const bool transfer_for_all_devices_;
  std::shared_ptr<DeviceTransfer> transfer_;
  std::shared_ptr<HostBufferPool> pool_;

  std::mutex mutex_;
  std::unordered_map<const void*, Entry> entries_;  // keyed by the handle's data pointer
  std::list<const void*> save_order_;               // live entries, oldest first
  OffloadStats counters_;                           // the event counters part of the stats

  DeferredReleaser releaser_;  // last member: destroyed first, so it drains while all else lives
};

}  // namespace torch_offload
