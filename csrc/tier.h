#pragma once
// A tier keeps the bytes of saved tensors between offload_save and offload_restore: pooled host
// memory (HostTier, host_tier.h) or files (DiskTier, disk_tier.h). The manager does the device side
// for every tier (copies, fences, prefetch to the device, version checks, save order, statistics)
// and asks a tier only where a tensor's bytes are in host memory. A new tier (GPUDirect storage,
// say) is a new Tier and StoredTensor pair in a file of its own.
#include <cstddef>
#include <functional>
#include <memory>

#include "device_transfer.h"
#include "offload_stats.h"

namespace torch_offload {

// Host memory holding a tensor's bytes for one restore.
struct HostBytes {
  const void* data = nullptr;
  // Run once the restore's copy has read `data` (empty: nothing to give back).
  std::function<void()> release;
  bool read_ahead = false;  // served by a read_ahead() that had finished or was under way
};

// One saved tensor in a tier. Thread-safe: restores of one handle may run on several threads.
class StoredTensor {
 public:
  virtual ~StoredTensor() = default;
  // Host memory the device-to-host copy writes into, from save until commit().
  virtual void* destination() = 0;
  // What the handle's storage points to: memory that shows the tensor's bytes once saved (the
  // host buffer; the disk file mapped copy-on-write).
  virtual void* handle_data() = 0;
  // Whether a view of the handle (a slice, a transpose) may be restored as a plain copy of that
  // memory: not for the disk tier, whose mapping lacks the bytes when a write failed.
  virtual bool views_restore_as_copies() const = 0;
  // The copy into destination() is queued; `landed` (null: it has completed) completes with it.
  virtual void commit(FencePtr landed) = 0;
  // The bytes when they are in host memory now (a device prefetch reads them), else null.
  virtual const void* resident() = 0;
  // Starts bringing the bytes into host memory ahead of a restore. Best effort: never throws, and
  // a failure only means the restore reads them itself.
  virtual void read_ahead() = 0;
  // The bytes in host memory for one restore, waiting for IO under way; throws a clear error when
  // they cannot be had.
  virtual HostBytes bytes_for_restore() = 0;
  // The handle is gone (or the save failed before commit() / after it): waits for IO under way
  // and returns what frees the memory, to run once no copy touches it any more.
  virtual std::function<void()> release() = 0;
};

class Tier {
 public:
  virtual ~Tier() = default;
  // Throws an error this tier has to report before anything new is saved (a failed write).
  virtual void check_before_save() {}
  // Room for `nbytes`. When `may_decline`, returns null if this tier is full so that the next tier
  // takes the tensor; otherwise throws a clear error.
  virtual std::shared_ptr<StoredTensor> reserve(size_t nbytes, bool may_decline) = 0;
  // Waits until the tier's background IO has finished.
  virtual void synchronize() {}
  virtual void add_stats(OffloadStats& stats) = 0;
  virtual void reset_stats() {}
  // Frees cached, unused memory.
  virtual void empty_cache() = 0;
};

}  // namespace torch_offload
