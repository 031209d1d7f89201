"""Python-side registrations of the C++ ops: fake kernels, for torch.compile and FakeTensor tracing."""
import torch

from ._library import load_library

load_library()


@torch.library.register_fake("offload::offload_save")
def _offload_save_fake(x, manager):
    # Also the kernel for real meta tensors (FakeTensors report their fake device, not meta): those
    # have no data, and an empty handle would restore as uninitialised memory.
    if x.device.type == "meta":
        raise RuntimeError("offload_save: got a meta tensor, which has no data to offload")
    # The handle is a contiguous host copy of x.
    return torch.empty(x.shape, dtype=x.dtype, device="cpu")


@torch.library.register_fake("offload::offload_restore")
def _offload_restore_fake(handle, device, manager):
    return torch.empty(handle.shape, dtype=handle.dtype, device=device)


# The autograd formulas (both ops are copies) are registered in C++ (ops/autograd/), so that they
# also apply in TorchScript run from C++ and in libtorch programs.

offload_save = torch.ops.offload.offload_save
offload_restore = torch.ops.offload.offload_restore
