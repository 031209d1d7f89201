#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torch_offload {

// Counters since the last reset_stats(); the *_in_use / cached values are current levels.
struct OffloadStats {
  int64_t saves = 0;
  int64_t restores = 0;
  int64_t bytes_to_host = 0;
  int64_t bytes_to_device = 0;
  int64_t prefetches = 0;      // host-to-device copies started ahead of their restore
  int64_t prefetch_hits = 0;   // restores served by such a copy
  int64_t in_flight_peak = 0;  // most device-to-host copies in flight at once
  // Device-to-host copies issued in batches (Manager::begin_batch), and the batches.
  int64_t batched_copies = 0;
  int64_t copy_batches = 0;
  int64_t host_bytes_in_use = 0;
  int64_t host_bytes_peak = 0;
  int64_t host_bytes_cached = 0;
  int64_t pool_hits = 0;
  int64_t pool_misses = 0;
  int64_t host_allocations = 0;  // blocks ever allocated (pinned allocations are the slow part)
  int64_t live_handles = 0;
  int64_t disk_files = 0;  // files currently in the disk tier
  int64_t disk_bytes_written = 0;
  int64_t disk_bytes_read = 0;
  int64_t disk_bytes_read_from_page_cache = 0;  // of disk_bytes_read; -1 where unknown
  // 1: the disk tier's files bypass the page cache (O_DIRECT); 2: each does when RAM is short
  int64_t disk_direct_io = 0;
  int64_t disk_bytes_written_direct = 0;  // of disk_bytes_written, around the page cache
  int64_t spills = 0;                     // tensors sent to disk because the host budget was full
  // keep_on_device_bytes: restores served by a source kept on the device (never copied), their
  // bytes, and the bytes kept on the device now.
  int64_t restores_kept_on_device = 0;
  int64_t bytes_kept_on_device = 0;
  int64_t window_bytes = 0;
  // The save hooks' deduplicated saves (offload_pack, saved_regions.h): saves packed, of them
  // offloaded and shared with an earlier save's copy, their bytes, and the distinct bytes they
  // cover.
  int64_t saved_tensors = 0;
  int64_t offloaded_saves = 0;
  int64_t shared_saves = 0;
  int64_t saved_bytes = 0;
  int64_t distinct_bytes_saved = 0;
  // Saves the save hooks' filter kept on the device (save_filter.h), and their bytes.
  int64_t kept_saves = 0;
  int64_t kept_bytes = 0;
  bool pinned = false;
  double compute_wait_ms = 0.0;   // compute stream stalled waiting for copies
  double host_wait_ms = 0.0;      // host thread blocked by the in-flight bound
  double disk_checksum_ms = 0.0;  // IO-thread time computing/verifying the disk files' CRC32C

  // Flat name/value view used by the TorchScript class and the Python API.
  std::vector<std::pair<std::string, double>> items() const {
    return {{"saves", double(saves)},
            {"restores", double(restores)},
            {"bytes_to_host", double(bytes_to_host)},
            {"bytes_to_device", double(bytes_to_device)},
            {"prefetches", double(prefetches)},
            {"prefetch_hits", double(prefetch_hits)},
            {"in_flight_peak", double(in_flight_peak)},
            {"batched_copies", double(batched_copies)},
            {"copy_batches", double(copy_batches)},
            {"host_bytes_in_use", double(host_bytes_in_use)},
            {"host_bytes_peak", double(host_bytes_peak)},
            {"host_bytes_cached", double(host_bytes_cached)},
            {"pool_hits", double(pool_hits)},
            {"pool_misses", double(pool_misses)},
            {"host_allocations", double(host_allocations)},
            {"live_handles", double(live_handles)},
            {"disk_files", double(disk_files)},
            {"disk_bytes_written", double(disk_bytes_written)},
            {"disk_bytes_read", double(disk_bytes_read)},
            {"disk_bytes_read_from_page_cache", double(disk_bytes_read_from_page_cache)},
            {"disk_direct_io", double(disk_direct_io)},
            {"disk_bytes_written_direct", double(disk_bytes_written_direct)},
            {"spills", double(spills)},
            {"restores_kept_on_device", double(restores_kept_on_device)},
            {"bytes_kept_on_device", double(bytes_kept_on_device)},
            {"window_bytes", double(window_bytes)},
            {"saved_tensors", double(saved_tensors)},
            {"offloaded_saves", double(offloaded_saves)},
            {"shared_saves", double(shared_saves)},
            {"saved_bytes", double(saved_bytes)},
            {"distinct_bytes_saved", double(distinct_bytes_saved)},
            {"kept_saves", double(kept_saves)},
            {"kept_bytes", double(kept_bytes)},
            {"pinned", pinned ? 1.0 : 0.0},
            {"compute_wait_ms", compute_wait_ms},
            {"host_wait_ms", host_wait_ms},
            {"disk_checksum_ms", disk_checksum_ms}};
  }
};

}  // namespace torch_offload
