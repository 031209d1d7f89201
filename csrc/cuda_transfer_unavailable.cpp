// Built instead of cuda_transfer.cpp when torch_offload is compiled without CUDA.
#include "cuda_transfer.h"

namespace torch_offload {

std::unique_ptr<DeviceTransfer> make_cuda_transfer() { return nullptr; }
std::unique_ptr<HostAllocator> make_pinned_allocator() { return nullptr; }

}  // namespace torch_offload
