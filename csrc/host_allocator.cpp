#include "host_allocator.h"

#include <cstdlib>

#include "cuda_transfer.h"

namespace torch_offload {
namespace {

class PageableAllocator final : public HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    // Page alignment, as pinned memory has: the disk tier's direct IO needs block-aligned buffers.
    constexpr size_t kAlign = 4096;
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    return std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
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
