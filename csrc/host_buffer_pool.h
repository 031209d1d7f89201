#pragma once
// Pool of host buffers reused across training steps. Pinned allocation is slow (91 ms for 256 MB)
// and torch's caching host allocator rounds to powers of two, so we keep our own size-keyed pool:
// in steady state every request is served from the cache (a "hit") and nothing new is pinned.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "host_allocator.h"

namespace torch_offload {

struct HostBlock {
  void* ptr = nullptr;
  size_t size = 0;  // bytes actually allocated (>= the request)
};

struct PoolStats {
  int64_t bytes_in_use = 0;  // handed out and not yet returned
  int64_t bytes_peak = 0;    // peak of bytes_in_use since the last reset
  int64_t bytes_cached = 0;  // returned, kept for reuse
  int64_t hits = 0;          // requests served from the cache
  int64_t misses = 0;        // requests that needed a new allocation
  int64_t allocations = 0;   // blocks allocated from the HostAllocator, ever
};

class HostBufferPool {
 public:
  // budget_bytes == 0 means no budget; otherwise in-use plus cached bytes never exceed it.
  HostBufferPool(std::unique_ptr<HostAllocator> allocator, int64_t budget_bytes);
  ~HostBufferPool();
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // Throws c10::Error naming the budget when it would be exceeded, or when the host is out of
  // memory.
  HostBlock acquire(size_t bytes);
  // Like acquire, but returns std::nullopt instead of throwing when the budget would be exceeded.
  std::optional<HostBlock> try_acquire(size_t bytes);
  void release(HostBlock block);
  // Frees every cached (unused) block.
  void empty_cache();

  PoolStats stats() const;
  void reset_counters();
  bool pinned() const { return allocator_->pinned(); }
  int64_t budget_bytes() const { return budget_bytes_; }

  // Requests are rounded up to this granularity so that tensors of nearly equal size share blocks.
  static constexpr size_t kGranularity = 4096;

 private:
  void free_cached_locked(size_t bytes_needed);
  std::optional<HostBlock> acquire_locked(size_t bytes, bool throw_over_budget);

  std::unique_ptr<HostAllocator> allocator_;
  const int64_t budget_bytes_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> cached_;  // size -> block, for best-fit lookup
  PoolStats stats_;
};

}  // namespace torch_offload
