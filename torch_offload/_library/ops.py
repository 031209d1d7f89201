"""Python-side registrations of the C++ ops: fake kernels (torch.compile, FakeTensor tracing), and
clear errors for inputs the engine cannot copy (the dispatcher's own error for them names a backend,
not the problem)."""
import torch
from torch._subclasses.fake_tensor import FakeTensor

from .loading import load_library

load_library()


def _reject_meta(x: torch.Tensor) -> None:
    # The fake kernel also serves as the Meta kernel: a real meta tensor (not a FakeTensor being
    # traced) would get an uninitialised host "copy" back.
    if x.device.type == "meta" and not isinstance(x, FakeTensor):
        raise ValueError("torch_offload.offload_save: x is on the meta device (no data to offload); "
                         "materialize the model (e.g. to_empty() and load weights) first")


@torch.library.register_fake("offload::offload_save")
def _offload_save_fake(x, manager):
    _reject_meta(x)
    # The handle is a contiguous host copy of x.
    return torch.empty(x.shape, dtype=x.dtype, device="cpu")


@torch.library.register_fake("offload::offload_restore")
def _offload_restore_fake(handle, device, manager):
    return torch.empty(handle.shape, dtype=handle.dtype, device=device)


def _describe_unsupported(x: torch.Tensor) -> str:
    if x.is_nested:
        return "a nested tensor; offload its components (x.unbind()) instead"
    if x.is_quantized:
        return f"a quantized tensor ({x.dtype}); offload x.dequantize() or keep it resident"
    if x.layout == torch._mkldnn:
        return "an MKLDNN tensor; offload x.to_dense() instead"
    if x.layout != torch.strided:
        return f"a sparse tensor ({x.layout}); offload x.to_dense() or keep it resident"
    return f"a tensor the engine cannot copy ({x.layout}, {x.dtype})"


def _reject_unsupported(x, manager):
    raise TypeError("torch_offload.offload_save: x is " + _describe_unsupported(x)
                    + "; only dense (strided) tensors can be offloaded")


# Kernels for the dispatch keys of sparse, quantized, MKLDNN and nested tensors, which the engine's
# CPU/CUDA kernels do not serve. (Nested tensors are caught at their autograd key: the C++ autograd
# kernel reads sizes, which nested tensors do not have.)
_UNSUPPORTED_KEYS = ("SparseCPU", "SparseCUDA", "SparseCsrCPU", "SparseCsrCUDA", "QuantizedCPU",
                     "QuantizedCUDA", "MkldnnCPU", "NestedTensorCPU", "NestedTensorCUDA",
                     "AutogradNestedTensor")
_library = torch.library.Library("offload", "IMPL")
for _key in _UNSUPPORTED_KEYS:
    _library.impl("offload_save", _reject_unsupported, _key)


# The autograd formulas (both ops are copies) are registered in C++ (ops/autograd/), so that they
# also apply in TorchScript run from C++ and in libtorch programs.

offload_save = torch.ops.offload.offload_save
# The save hooks' deduplicated saves (csrc/saved_regions.h); the overloads themselves, called once
# per saved tensor, skip the packet's overload lookup.
offload_pack = torch.ops.offload.offload_pack.default
# The save hooks' pack of a plain tensor after the engine's filter (csrc/save_filter.h).
offload_pack_filtered = torch.ops.offload.offload_pack_filtered.default
offload_unpack = torch.ops.offload.offload_unpack.default
offload_batch = torch.ops.offload.offload_batch.default
_restore_op = torch.ops.offload.offload_restore


def offload_restore(handle: torch.Tensor, device, manager: int) -> torch.Tensor:
    """torch.ops.offload.offload_restore, with a clear error for a CUDA device where there is none
    (CUDA's own is "driver version is insufficient")."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"torch_offload.offload_restore: device={str(device)!r}, but CUDA is not "
                           "available on this machine (torch.cuda.is_available() is False)")
    return _restore_op(handle, device, manager)
