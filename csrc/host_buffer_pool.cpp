#include "host_buffer_pool.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>

namespace torch_offload {
namespace {

size_t round_up(size_t bytes) {
  const size_t g = HostBufferPool::kGranularity;
  TORCH_CHECK(bytes <= SIZE_MAX - g, "torch_offload: cannot offload ", static_cast<double>(bytes),
              " bytes");
  return bytes == 0 ? g : (bytes + g - 1) / g * g;
}

// A cached block is reused for a request when it wastes at most a quarter of its size.
bool fits(size_t block_size, size_t request) { return block_size <= request + request / 4; }

}  // namespace

HostBufferPool::HostBufferPool(std::unique_ptr<HostAllocator> allocator, int64_t budget_bytes)
    : allocator_(std::move(allocator)), budget_bytes_(budget_bytes) {
  TORCH_CHECK(budget_bytes_ >= 0, "host_budget_bytes must be >= 0 (0 = unlimited), got ",
              budget_bytes_);
}

HostBufferPool::~HostBufferPool() { empty_cache(); }

HostBlock HostBufferPool::acquire(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  return *acquire_locked(bytes, /*throw_over_budget=*/true);
}

std::optional<HostBlock> HostBufferPool::try_acquire(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  return acquire_locked(bytes, /*throw_over_budget=*/false);
}

std::optional<HostBlock> HostBufferPool::acquire_locked(size_t bytes, bool throw_over_budget) {
  const size_t size = round_up(bytes);
  auto it = cached_.lower_bound(size);
  if (it != cached_.end() && fits(it->first, size)) {
    HostBlock block{it->second, it->first};
    cached_.erase(it);
    stats_.bytes_cached -= static_cast<int64_t>(block.size);
    stats_.bytes_in_use += static_cast<int64_t>(block.size);
    stats_.bytes_peak = std::max(stats_.bytes_peak, stats_.bytes_in_use);
    stats_.hits++;
    return block;
  }
  if (budget_bytes_ > 0) {
    const bool fits_budget = stats_.bytes_in_use + static_cast<int64_t>(size) <= budget_bytes_;
    if (!fits_budget && !throw_over_budget) return std::nullopt;
    TORCH_CHECK(fits_budget, "torch_offload: host memory budget exceeded: offloading ", bytes,
                " more bytes would need ", stats_.bytes_in_use + static_cast<int64_t>(size),
                " bytes of host memory, over host_budget_bytes=", budget_bytes_,
                ". Raise host_budget_bytes, give a disk_dir to spill to, or offload fewer "
                "tensors; nothing was offloaded.");
    const int64_t over =
        stats_.bytes_in_use + stats_.bytes_cached + static_cast<int64_t>(size) - budget_bytes_;
    if (over > 0) free_cached_locked(static_cast<size_t>(over));
  }
  void* ptr = allocator_->allocate(size);
  if (ptr == nullptr && stats_.bytes_cached > 0) {
    free_cached_locked(static_cast<size_t>(stats_.bytes_cached));
    ptr = allocator_->allocate(size);
  }
  TORCH_CHECK(ptr != nullptr, "torch_offload: could not allocate ", size, " bytes of ",
              allocator_->pinned() ? "pinned" : "pageable", " host memory (host RAM exhausted?); ",
              stats_.bytes_in_use, " bytes are held by offloaded tensors. Nothing was offloaded.");
  stats_.allocations++;
  stats_.misses++;
  stats_.bytes_in_use += static_cast<int64_t>(size);
  stats_.bytes_peak = std::max(stats_.bytes_peak, stats_.bytes_in_use);
  return HostBlock{ptr, size};
}

void HostBufferPool::release(HostBlock block) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.bytes_in_use -= static_cast<int64_t>(block.size);
  stats_.bytes_cached += static_cast<int64_t>(block.size);
  cached_.emplace(block.size, block.ptr);
}

void HostBufferPool::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  free_cached_locked(static_cast<size_t>(stats_.bytes_cached));
}

void HostBufferPool::free_cached_locked(size_t bytes_needed) {
  // Largest first: frees the requested amount with the fewest (slow) pinned frees.
  size_t freed = 0;
  while (freed < bytes_needed && !cached_.empty()) {
    auto last = std::prev(cached_.end());
    allocator_->release(last->second);
    freed += last->first;
    stats_.bytes_cached -= static_cast<int64_t>(last->first);
    cached_.erase(last);
  }
}

PoolStats HostBufferPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void HostBufferPool::reset_counters() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.hits = 0;
  stats_.misses = 0;
  stats_.bytes_peak = stats_.bytes_in_use;
}

}  // namespace torch_offload
