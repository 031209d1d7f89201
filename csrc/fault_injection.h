#pragma once
// Test hook: makes chosen failure sites of the engine fail as they would for real (an allocation
// that finds no memory, a thread that cannot start), so tests can drive every error path without
// exhausting the machine. Off unless a test arms it; an unarmed site costs one atomic load.
#include <cstdint>

namespace torch_offload {

enum class FaultSite : int {
  kDiskWriteStaging,      // staging buffer of a disk write (save)
  kDiskReadAheadStaging,  // staging buffer of a disk read-ahead (prefetch in backward)
  kDiskRestoreStaging,    // staging buffer of a disk read on restore
  kHandleContext,         // the handle's owner record (save, every tier)
  kIoThreadStart,         // starting a DiskStore IO thread
  kReleaserThreadStart,   // starting a DeferredReleaser's thread (each Manager has one)
  kDiskNoTmpfile,         // the filesystem of disk_dir has no O_TMPFILE (fallback path)
  kDiskReserve,           // reserving a new disk-tier file's space fails as on a full disk
  kCount,
};

// After `skip` more passes through `site`, the next `times` passes fail.
void inject_fault(FaultSite site, int64_t skip, int64_t times = 1);
void clear_injected_faults();
// Called at the site: true when it must fail now.
bool fault_injected(FaultSite site);

}  // namespace torch_offload
