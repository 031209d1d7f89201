#include "host_allocator.h"

#include <cstdlib>

#include "cuda_transfer.h"

namespace torch_offload {
namespace {

class PageableAllocator final : public HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    // 64-byte alignment keeps vectorised CPU copies fast and matches what the DMA engines like.
    const size_t rounded = (bytes + 63) / 64 * 64;
    return std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  }
  void release(void* ptr) override { std::free(ptr); }
  bool pinned() const override { return false; }
};

}  // namespace

std::unique_ptr<HostAllocator> make_pageable_allocator() {
  return std::make_unique<PageableAllocator>();
}

std::unique_ptr<HostAllocator> make_default_host_allocator() {
  if (auto pinned = make_pinned_allocator()) return pinned;
  return make_pageable_allocator();
}

}  // namespace torch_offload
