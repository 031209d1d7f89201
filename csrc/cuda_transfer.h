#pragma once
// Factories for the CUDA pieces; both return nullptr when built without CUDA or when no CUDA
// device is present, so callers fall back to pageable memory and synchronous CPU copies.
#include <memory>

#include "device_transfer.h"
#include "host_allocator.h"

namespace torch_offload {

std::unique_ptr<DeviceTransfer> make_cuda_transfer();
std::unique_ptr<HostAllocator> make_pinned_allocator();

}  // namespace torch_offload
