#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torch_offload {

// Every statistic, once: X(type, name). The struct's fields, their names and the flat name/value
// view all come from this list, so a statistic added here is reported everywhere (the TorchScript
// class's stats(), torch.ops.offload.stat_names(), the Python package). Counters count since the
// last reset_stats(); the *_in_use / cached / window values are current levels
// (docs/reference/stats.md says which is which).
// clang-format off
#define TORCH_OFFLOAD_STATS(X)                                                                   \
  X(int64_t, saves)                                                                              \
  X(int64_t, restores)                                                                           \
  X(int64_t, bytes_to_host)                                                                      \
  X(int64_t, bytes_to_device)                                                                    \
  /* host-to-device copies started ahead of their restore, and restores served by such a copy */ \
  X(int64_t, prefetches)                                                                         \
  X(int64_t, prefetch_hits)                                                                      \
  /* most device-to-host copies in flight at once */                                             \
  X(int64_t, in_flight_peak)                                                                     \
  /* device-to-host copies issued in batches (Manager::begin_batch), and the batches */          \
  X(int64_t, batched_copies)                                                                     \
  X(int64_t, copy_batches)                                                                       \
  X(int64_t, host_bytes_in_use)                                                                  \
  X(int64_t, host_bytes_peak)                                                                    \
  X(int64_t, host_bytes_cached)                                                                  \
  X(int64_t, pool_hits)                                                                          \
  X(int64_t, pool_misses)                                                                        \
  /* blocks ever allocated (pinned allocations are the slow part) */                             \
  X(int64_t, host_allocations)                                                                   \
  X(int64_t, live_handles)                                                                       \
  /* files currently in the disk tier */                                                         \
  X(int64_t, disk_files)                                                                         \
  /* now: bytes of freed tensors' files kept open for the next files of their size */            \
  X(int64_t, disk_bytes_cached)                                                                  \
  X(int64_t, disk_bytes_written)                                                                 \
  X(int64_t, disk_bytes_read)                                                                    \
  /* of disk_bytes_read; -1 where unknown */                                                     \
  X(int64_t, disk_bytes_read_from_page_cache)                                                    \
  /* 1: the disk tier's files bypass the page cache (O_DIRECT); 2: each does when RAM is short */ \
  X(int64_t, disk_direct_io)                                                                     \
  /* of disk_bytes_written, around the page cache */                                             \
  X(int64_t, disk_bytes_written_direct)                                                          \
  /* tensors sent to disk because the host budget was full */                                    \
  X(int64_t, spills)                                                                             \
  /* keep_on_device_bytes: restores served by a source kept on the device (never copied), their  \
     bytes, and the bytes kept on the device now */                                              \
  X(int64_t, restores_kept_on_device)                                                            \
  X(int64_t, bytes_kept_on_device)                                                               \
  X(int64_t, window_bytes)                                                                       \
  /* the save hooks' deduplicated saves (offload_pack, saved_regions.h): saves packed, of them   \
     offloaded and shared with an earlier save's copy, their bytes, and the distinct bytes they  \
     cover */                                                                                    \
  X(int64_t, saved_tensors)                                                                      \
  X(int64_t, offloaded_saves)                                                                    \
  X(int64_t, shared_saves)                                                                       \
  X(int64_t, saved_bytes)                                                                        \
  X(int64_t, distinct_bytes_saved)                                                               \
  /* saves the save hooks' filter kept on the device (save_filter.h), and their bytes */         \
  X(int64_t, kept_saves)                                                                         \
  X(int64_t, kept_bytes)                                                                         \
  X(bool, pinned)                                                                                \
  /* compute stream stalled waiting for copies */                                                \
  X(double, compute_wait_ms)                                                                     \
  /* host thread blocked by the in-flight bound */                                               \
  X(double, host_wait_ms)                                                                        \
  /* IO-thread time computing/verifying the disk files' CRC32C */                                \
  X(double, disk_checksum_ms)                                                                    \
  /* restores blocked waiting for a file's bytes (its write, read-ahead or read) */              \
  X(double, disk_read_wait_ms)                                                                   \
  /* time making the disk tier's files (create or reuse, reserve, map: on the saving thread) and \
     freeing them (unmap; close or keep for reuse: on the thread that frees their handles) */     \
  X(double, disk_create_ms)                                                                      \
  X(double, disk_close_ms)
// clang-format on

struct OffloadStats {
#define TORCH_OFFLOAD_STAT_FIELD(type, name) type name{};
  TORCH_OFFLOAD_STATS(TORCH_OFFLOAD_STAT_FIELD)
#undef TORCH_OFFLOAD_STAT_FIELD

  // The statistics' names, in the order of the list.
  static constexpr std::array names{
#define TORCH_OFFLOAD_STAT_NAME(type, name) #name,
      TORCH_OFFLOAD_STATS(TORCH_OFFLOAD_STAT_NAME)
#undef TORCH_OFFLOAD_STAT_NAME
  };

  // Flat name/value view used by the TorchScript class and the Python API (a bool is 0 or 1).
  std::vector<std::pair<std::string, double>> items() const {
    return {
#define TORCH_OFFLOAD_STAT_ITEM(type, name) {#name, static_cast<double>(name)},
        TORCH_OFFLOAD_STATS(TORCH_OFFLOAD_STAT_ITEM)
#undef TORCH_OFFLOAD_STAT_ITEM
    };
  }
};

}  // namespace torch_offload
