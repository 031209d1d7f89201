#pragma once
#include <cstdint>
#include <string>

namespace torch_offload {

// More IO threads than this would only share the host's CPUs (and a thread count is an int).
constexpr int64_t kMaxDiskIoThreads = 256;

struct ManagerConfig {
  // Device-to-host copies allowed in flight before offload_save blocks the host (bounds the GPU
  // memory held by sources that are still being copied). 0 = unbounded.
  int64_t max_in_flight = 4;
  // How many earlier-saved tensors to start copying back when one is restored (backward order is
  // the reverse of save order). 0 disables prefetch.
  int64_t prefetch_depth = 1;
  // Most host bytes the pool may hold (in use plus cached). 0 = unlimited.
  int64_t host_budget_bytes = 0;
  // Each device-to-host copy completes before offload_save returns, and nothing is prefetched:
  // the lowest resident memory (the "sync" / "legacy" mode), and a debugging baseline.
  bool synchronous = false;
  // Directory of the disk tier ("" = none). With disk_only every tensor goes to a file there (the
  // "disk" mode); otherwise tensors that would exceed host_budget_bytes spill there.
  std::string disk_dir;
  bool disk_only = false;
  // Threads writing and reading the disk tier's files: each write and read is a CPU copy into or
  // out of the page cache plus a checksum, so several run in parallel to keep up with the GPU.
  // Each thread writes one file at a time from its staging buffer, so saves wait while this many
  // writes are under way: it also bounds the host memory the writes' staging buffers hold. Where
  // the host has CPUs and RAM to spare, more threads shorten the forward's wait for writes
  // (docs/performance.md, all, sync, disk).
  int64_t disk_io_threads = 4;
  // Files read into host memory ahead of their restore, in backward order (at least
  // prefetch_depth; none when prefetch_depth is 0): a file read takes longer than a device copy.
  int64_t disk_read_ahead = 3;
  // The disk tier's files bypass the page cache (O_DIRECT, where the filesystem allows it): for
  // hosts whose RAM cannot hold what goes to disk, where the page cache only adds a copy of each
  // byte and pushes other data out. Off by default: where RAM is plentiful the page cache serves
  // backward's reads at memory speed.
  bool disk_direct_io = false;
  // Instead, each file decides when it is made: around the page cache once the host's available
  // RAM cannot hold it beside the files already kept through the page cache and 1 GiB for
  // everything else (direct_io_policy.h).
  bool disk_direct_io_auto = false;
  // Each save first makes the compute stream wait for the copies of earlier saves and releases
  // their sources in stream order. For saves a layer apart (checkpoint boundaries, compiled graphs
  // whose host runs far ahead of the GPU) the wait is free and the memory is reusable at once;
  // for saves a few kernels apart ("all" mode) it would stall, so it is off by default.
  bool release_sources_on_save = false;
  // Bytes of the newest saves kept on the device instead of copied (0 = none): a save enters a
  // window of the newest saves and is copied to host memory only when newer saves push it out.
  // Backward restores the newest saves first, so the saves a forward ends with are never copied
  // either way; this spends that much device memory where the link cannot carry the last copies of
  // a forward before backward needs them. Host tier, asynchronous copies only.
  int64_t keep_on_device_bytes = 0;
};

}  // namespace torch_offload
