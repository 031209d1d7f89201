#pragma once
// The offload engine behind one OffloadManager: saves tensors into pooled host buffers, restores
// them (from a prefetched copy when one is ready), bounds copies in flight and keeps statistics.
// Thread-safe: backward runs on autograd worker threads while the main thread may still save.
//
// Its parts: the tiers that hold the bytes (host_tier.h, disk_tier.h), the window of saves kept on
// the device (device_window.h), the batch of pending device-to-host copies (copy_batch.h), the
// background releaser of sources and buffers (deferred_releaser.h) and the save hooks' tables
// (saved_regions.h, save_filter.h). The Manager holds the live handles' entries and ties them
// together: one mutex (mutex_) guards the entries, their save order, the window, the batch and the
// event counters, which change together. Device copies are started under it; the in-flight bound
// and a tier's IO are waited for without it, so that other threads' saves and restores go on.
//
// Its member definitions, by concern: manager.cpp (construction, devices, handles, statistics),
// manager_save.cpp (saves, batches, sources), manager_window.cpp (the window of saves kept on the
// device) and manager_restore.cpp (restores and prefetch).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "copy_batch.h"
#include "deferred_releaser.h"
#include "device_transfer.h"
#include "device_window.h"
#include "disk_tier.h"
#include "host_tier.h"
#include "manager_config.h"
#include "offload_stats.h"
#include "save_filter.h"
#include "saved_regions.h"
#include "source_slot.h"

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

  // Starts copying `x` to host memory and returns the host tensor (the handle). The handle keeps
  // the host copy alive; `x` itself is released as soon as the copy has finished.
  at::Tensor save(const at::Tensor& x);
  // Returns the saved tensor on `device`, ready for use on the current (compute) stream.
  at::Tensor restore(const at::Tensor& handle, c10::Device device);
  // Starts copying the handle's data to `device` ahead of a restore, which then only waits for it
  // (layer offloading knows which weights come next; backward prefetch of activations is
  // automatic). A no-op when a prefetch is already pending, for synchronous managers, and where
  // restores are plain copies (CPU, disk tier).
  void prefetch(const at::Tensor& handle, c10::Device device);
  // Prefetches the `count` newest entries in host memory saved from `device` that backward has not
  // restored yet, as each restore prefetches the entries before it: backward restores newest first,
  // and nothing else prefetches its first restores (called while the LM head's backward runs, they
  // overlap it). A no-op for synchronous managers and where restores are plain copies.
  void prefetch_newest(c10::Device device, int64_t count);
  // Saves on this thread, from begin_batch() until the matching end_batch() (calls nest), queue
  // their device-to-host copies and issue them together: one ordering point after the compute
  // stream and one fence per batch instead of per copy (modes "modules": each selected module's
  // call). A batch is issued at end_batch, when kMaxBatch copies are pending, and before anything
  // uses a pending copy (a restore, a prefetch, finish_save, synchronize, a handle's death). A
  // batch is issued once fewer than max_in_flight copies are in flight, so the bound may be passed
  // by a batch. Other threads' saves, synchronous managers and the disk tier copy one by one.
  void begin_batch();
  void end_batch();
  static constexpr size_t kMaxBatch = CopyBatch::kMaxCopies;  // pending sources stay on the device

  // A later save shares the copy of the handle whose storage context is `key` (SavedRegions):
  // backward unpacks that save first, so the entry moves to the newest end of the save order that
  // backward's prefetches walk (rotary cos / sin, saved in the first block and again in every
  // other, are restored first in the last block's backward). A no-op for an unknown key.
  void saved_again(const void* key);
  // Makes the current stream wait for the handle's device-to-host copy and releases the device
  // source now. The background releaser frees sources in host order, and the host runs ahead of
  // the GPU, so the allocator would still count sources whose copies the GPU has not reached;
  // waiting in stream order lets their memory be reused at once (the wait costs nothing when the
  // copy is done, as it is at the end of the layer that saved it).
  void finish_save(const at::Tensor& handle);
  // finish_save for every handle whose source is still held.
  void finish_all_saves();

  // The table that deduplicates the saves of the save hooks (offload_pack / offload_unpack).
  SavedRegions& saved_regions() { return *regions_; }
  // What the save hooks offload, one filter per set of hooks (offload_pack_filtered).
  SaveFilters& save_filters() { return filters_; }

  OffloadStats stats();
  void reset_stats();
  // Blocks until every copy queued so far has completed and its memory was released.
  void synchronize();
  // Frees cached host buffers (buffers held by live handles stay).
  void empty_pool();
  // Test hook for the disk tier (no-op without one).
  void simulate_full_disk(bool full) {
    if (disk_) disk_->simulate_full_disk(full);
  }
  // Test hook: the host's available RAM as disk_direct_io_auto sees it (-1: the real one).
  void simulate_available_ram(int64_t bytes) {
    if (disk_) disk_->simulate_available_ram(bytes);
  }

  int64_t id() const { return id_; }
  const ManagerConfig& config() const { return config_; }
  // Earlier saves copied back when one is restored (ManagerConfig::prefetch_depth), now and from
  // here on: the selective mode raises it once a block's first forward shows how many it saves.
  int64_t prefetch_depth() const { return prefetch_depth_.load(std::memory_order_relaxed); }
  void set_prefetch_depth(int64_t depth);
  // The window of saves kept on the device (ManagerConfig::keep_on_device_bytes), now and from
  // here on: a smaller one copies its oldest entries out at once (device_window.h).
  int64_t keep_on_device_bytes() const { return window_.limit(); }
  void set_keep_on_device_bytes(int64_t bytes);

 private:
  // One live handle. Its bytes are in a tier (`stored`); the rest is what every tier shares.
  struct Entry {
    std::shared_ptr<StoredTensor> stored;
    std::vector<int64_t> sizes;  // the handle's shape, strides and dtype
    std::vector<int64_t> strides;
    c10::ScalarType dtype = c10::kFloat;
    c10::Device source_device{c10::kCPU};
    c10::VariableVersion version_counter;  // disabled unless the source had one
    uint32_t saved_version = 0;
    FencePtr to_host_done;               // null when the copy was synchronous
    std::shared_ptr<SourceSlot> source;  // the device source while its copy may still read it
    FencePtr last_fence;                 // latest queued copy that touches the tier's memory
    at::Tensor prefetched;               // device copy started ahead of the restore
    FencePtr prefetch_done;
    // The device source while the entry is kept on the device (keep_on_device_bytes, or a batch
    // that could not be issued): no copy started, the host memory unwritten. Every other path
    // treats such an entry as one whose bytes are not in host memory yet: nothing prefetches it,
    // and a restore that needs its host bytes (another device, a view of its handle) copies it out
    // first (evict_locked). Held until the handle dies once a restore used it.
    at::Tensor kept_source;
    bool in_window = false;     // kept and still counted in window_ (at window_pos)
    bool copy_pending = false;  // its copy waits in batch_: no fence, no source yet
    bool restored = false;
    std::list<const void*>::iterator order_pos;
    DeviceWindow::Position window_pos;
  };
  // The context of a handle's storage: it frees the entry when the handle dies, and tells which
  // manager a tensor belongs to. Its address is the entry's key.
  struct HandleContext {
    std::shared_ptr<Manager> manager;
  };
  static void free_handle(void* context);

  // Methods named *_locked are called with mutex_ held.
  Manager(const ManagerConfig& config, std::shared_ptr<DeviceTransfer> transfer,
          std::unique_ptr<HostAllocator> allocator);
  DeviceTransfer* transfer_for(c10::Device device) const;
  static c10::Device with_index(c10::Device device);
  // with_index(device) for a copy to `device` that `op` asked for, after checking that this process
  // can copy there: an error naming `op` and the device rather than one of CUDA's.
  c10::Device target_device(c10::Device device, const char* op) const;
  // The handle for `stored`: a tensor shaped like `like` whose storage is owned by a HandleContext.
  at::Tensor make_handle(StoredTensor& stored, const at::Tensor& like);
  void on_handle_freed(const void* key);
  at::Tensor host_tensor(const Entry& entry, const void* data) const;

  // The save side: a save's copy to host memory and its entry.
  struct ToHostCopy {
    FencePtr done;  // null when the copy was synchronous
    double host_wait_ms = 0.0;
    std::shared_ptr<SourceSlot> source;  // set while an asynchronous copy may read the source
  };
  // Copies src into dst (bounded in flight, or synchronously).
  ToHostCopy copy_to_host(const at::Tensor& src, const at::Tensor& dst, DeviceTransfer* transfer);
  // The asynchronous copy of copy_to_host, without waiting for the in-flight bound.
  ToHostCopy start_copy_to_host(const at::Tensor& src, const at::Tensor& dst,
                                DeviceTransfer* transfer);
  // An entry with its kept_source set goes into the window of saves kept on the device.
  void add_entry_locked(const void* key, Entry entry, const at::Tensor& x, const ToHostCopy& copy);
  // Records `copy` (its fence, its source) as the entry's copy to host memory.
  static void set_copy_to_host(Entry& entry, const ToHostCopy& copy);

  // The entries kept on the device (window_, keep_on_device_bytes). Adds `key` (its entry's
  // kept_source set) to the window, then copies out the oldest entries until the window fits.
  void enter_window_locked(const void* key, Entry& entry);
  // Copies out the window's oldest entries until it fits its limit.
  void shrink_window_locked();
  // Starts the deferred copy of a kept entry to host memory: from here on it is like any other.
  void evict_locked(Entry& entry);
  void leave_window_locked(Entry& entry);
  // A restore served by the kept source: a new tensor on the source's memory.
  at::Tensor restore_kept_locked(Entry& entry, c10::Device device, DeviceTransfer* transfer);

  // The copies queued by saves since begin_batch, not issued yet (batch_). Whether a save of `src`
  // into a tier joins this thread's batch.
  bool joins_batch(const at::Tensor& src, const DeviceTransfer* transfer, const Tier* tier) const;
  // Queues the copy of the entry `key` (just added), after issuing the pending ones where they came
  // from another stream. A full batch is issued by the caller, without the lock (issue_batch).
  void add_to_batch_locked(const void* key, const at::Tensor& src, const at::Tensor& destination);
  // Issues the pending copies, if any: their entries get the batch's fence and their sources go to
  // the releaser. If the copies cannot be issued, their entries keep their sources on the device
  // (restores are served from there) and the error is raised.
  void issue_batch_locked();
  // issue_batch_locked after waiting for the in-flight bound (not under the lock).
  void issue_batch();

  // The restore side: the entry of a handle, its restore, and the prefetches of what backward
  // restores next (the entries saved before it, save_order_ walked towards the oldest). The entry
  // of `handle`, or null for a tensor no manager saved; throws for another manager's
  // handle and for a view of a handle that holds no data.
  Entry* find_entry_locked(const at::Tensor& handle, const char* op);
  void check_unmodified(const Entry& entry) const;
  void prefetch_before_locked(const Entry& restored, c10::Device device, DeviceTransfer* transfer);
  // Walks the entries saved before `before`, newest first, on `device` and not yet restored:
  // starts the device copy of up to `copies` of those in host memory, reads up to `reads` of the
  // others ahead (disk tier). Automatic prefetch in backward and prefetch_newest.
  void prefetch_walk_locked(std::list<const void*>::iterator before, c10::Device device,
                            DeviceTransfer* transfer, int64_t copies, int64_t reads);
  // Starts the device copy of `entry` that its next restore will take.
  // Copies `bytes` (the entry's resident host bytes) to `device` ahead of the restore.
  void start_prefetch_locked(Entry& entry, const void* bytes, c10::Device device,
                             DeviceTransfer* transfer);
  // The device copy of `host` (the entry's data) for a restore, ordered before compute-stream use.
  at::Tensor copy_for_restore_locked(Entry& entry, const void* host, c10::Device device,
                                     DeviceTransfer* transfer);
  // Counts a restore of `out` from `entry` and prefetches what backward needs next.
  void finish_restore_locked(Entry& entry, const at::Tensor& out, c10::Device device,
                             DeviceTransfer* transfer);

  // A source taken out of its entry, to be released after the compute stream waits for its copy.
  struct HeldSource {
    std::shared_ptr<SourceSlot> source;
    FencePtr done;
    c10::Device device{c10::kCPU};
  };
  static HeldSource take_source_locked(Entry& entry);
  void release_in_stream_order(const HeldSource& held);

  const ManagerConfig config_;
  std::atomic<int64_t> prefetch_depth_;
  int64_t id_ = 0;
  const bool transfer_for_all_devices_;
  std::shared_ptr<DeviceTransfer> transfer_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<DiskTier> disk_;  // null without disk_dir
  std::vector<Tier*> save_tiers_;   // where saves go, first choice first

  // Guards entries_, save_order_, window_, batch_ and counters_ (see the top of this file).
  std::mutex mutex_;
  std::unordered_map<const void*, Entry> entries_;  // keyed by the handle's HandleContext
  std::list<const void*> save_order_;               // live entries, oldest first
  DeviceWindow window_;    // entries kept on the device; its limit is read without the lock
  OffloadStats counters_;  // the event counters part of the stats

  CopyBatch batch_;  // its batching thread is read without the lock by saves

  std::unique_ptr<SavedRegions> regions_;  // uses save / restore above
  SaveFilters filters_;

  // Filled by the releaser's payloads: declared before it, so alive while it drains.
  FinishedSources finished_sources_;
  DeferredReleaser releaser_;  // last member: destroyed first, so it drains while all else lives
};

}  // namespace torch_offload
