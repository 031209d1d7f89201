"""Running one function through torch_offload.checkpoint and torch's own checkpoint (both
non-reentrant) and comparing outputs and gradients bit for bit: the helpers of the test files that
bring PyTorch's checkpoint tests over (test_checkpoint_torch_suite*.py)."""
import functools

import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import torch_offload

ours = functools.partial(torch_offload.checkpoint, use_reentrant=False)
theirs = functools.partial(torch_checkpoint, use_reentrant=False)


def _grads(checkpoint, fn, make_inputs, seed=0, **kwargs):
    """Runs checkpoint(fn, *inputs).sum().backward() from a fixed seed: output and input grads."""
    torch.manual_seed(seed)
    inputs = make_inputs()
    out = checkpoint(fn, *inputs, **kwargs)
    out.sum().backward()
    return out.detach(), [t.grad for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]


def _assert_matches_torch(fn, make_inputs, **kwargs):
    out_a, grads_a = _grads(ours, fn, make_inputs, **kwargs)
    out_b, grads_b = _grads(theirs, fn, make_inputs, **kwargs)
    assert torch.equal(out_a, out_b)
    assert len(grads_a) == len(grads_b) and all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
