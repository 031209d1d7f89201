#pragma once
// Where the host buffer pool gets its memory: pinned (page-locked, for async DMA) when a CUDA
// device exists, pageable otherwise. Kept behind an interface so the pool is testable on CPU.
#include <cstddef>
#include <memory>

namespace torch_offload {

class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  // Returns nullptr when the memory cannot be had (host RAM exhausted).
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  virtual bool pinned() const = 0;
};

// malloc-backed; used on CPU-only machines and in tests.
std::unique_ptr<HostAllocator> make_pageable_allocator();

// cudaHostAlloc-backed when built with CUDA and a device is present; otherwise pageable.
std::unique_ptr<HostAllocator> make_default_host_allocator();

}  // namespace torch_offload
