"""Python-side registrations of the C++ ops: fake kernels (for torch.compile / FakeTensor tracing)
and autograd formulas (both ops are copies, so their gradients are copies back)."""
import torch

from ._library import load_library

load_library()


@torch.library.register_fake("offload::offload_save")
def _offload_save_fake(x, manager):
    # The handle is a contiguous host copy of x.
    return torch.empty(x.shape, dtype=x.dtype, device="cpu")


@torch.library.register_fake("offload::offload_restore")
def _offload_restore_fake(handle, device, manager):
    return torch.empty(handle.shape, dtype=handle.dtype, device=device)


def _save_setup_context(ctx, inputs, output):
    ctx.source_device = inputs[0].device


def _save_backward(ctx, grad):
    return grad.to(ctx.source_device), None


def _restore_backward(ctx, grad):
    return grad.to("cpu"), None, None


torch.library.register_autograd(
    "offload::offload_save", _save_backward, setup_context=_save_setup_context
)
torch.library.register_autograd("offload::offload_restore", _restore_backward)

offload_save = torch.ops.offload.offload_save
offload_restore = torch.ops.offload.offload_restore
