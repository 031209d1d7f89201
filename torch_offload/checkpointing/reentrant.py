"""The reentrant variant of our checkpoint: one autograd node per checkpointed block.

torch's non-reentrant checkpoint (what checkpoint() builds on by default) runs the block's forward
with grad enabled, builds the block's whole autograd graph and passes every tensor it saves through a
Python hook, to recompute them later. Where a step is bound by the host (short sequences: at 4k
tokens on the reference model the GPU idles a third of a step under checkpointing), that bookkeeping
costs more than the recompute. Here the forward runs under no_grad inside one autograd.Function, as
in torch's reentrant checkpoint: no graph, no hooks. Its backward restores the block's input from
host memory (offloaded as in checkpoint()), recomputes the block with grad enabled (RNG state and
autocast as in forward), and runs backward through the recomputed graph.

The limits are torch's reentrant checkpoint's: gradients reach parameters and inputs through
.backward() only (torch.autograd.grad, or backward with inputs=, raise a clear error), and a block
whose outputs need no gradient is not recomputed. Unlike torch's, keyword arguments are taken, and a
block whose tensor inputs all have requires_grad=False (frozen embeddings, as in LoRA training) still
gets its parameters' gradients (torch's reentrant checkpoint silently gives none).

Tested: fp32 gradients bit-equal to torch's checkpoints (python_tests/checkpointing/test_reentrant.py), under
FSDP2 (python_tests/fsdp2_cases.py) and with a sequence-parallel DTensor block input, offloaded as
its local shard as in checkpoint() (python_tests/support/tp_cases.py).

`scopes` (optional): a function returning the forward and the recompute context of one block, like
a context_fn; the selective "attention" policies pass theirs (policies/interception.py) so that the
block's attention outputs are offloaded in forward and restored instead of recomputed.
"""
import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from .._library.manager import default_manager
from .block_input import OffloadedInput
from .flat_args import split_tensors, with_tensors
from .replay_state import ReplayState


def _no_scopes():
    return contextlib.nullcontext(), contextlib.nullcontext()


class _Block:
    """What the backward of one block needs besides its saved tensors."""

    __slots__ = ("function", "template", "input", "replay", "recompute_scope", "out_template")


class _OffloadedRecompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, block: _Block, forward_scope, first, *others):
        ctx.block = block
        ctx.set_materialize_grads(False)  # outputs without a gradient are left out of backward
        ctx.save_for_backward(*others)
        args, kwargs = with_tensors(block.template, (first, *others))
        with forward_scope:
            outputs = block.function(*args, **kwargs)
        tensors, block.out_template = split_tensors(outputs)
        return tuple(tensors)

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(
                "torch_offload.checkpoint(use_reentrant=True) (also apply(..., use_reentrant=True)) computes "
                "gradients through .backward() only: it cannot serve torch.autograd.grad() or backward(inputs=...). "
                "Use use_reentrant=False (the default), or call .backward() without inputs=")
        block = ctx.block
        saved = ctx.saved_tensors
        first = block.input.restore()
        others = [t.detach().requires_grad_(t.requires_grad) for t in saved]
        args, kwargs = with_tensors(block.template, (first, *others))
        with contextlib.ExitStack() as stack:
            block.replay.enter(stack)
            stack.enter_context(torch.enable_grad())
            stack.enter_context(block.recompute_scope)
            outputs = block.function(*args, **kwargs)
        tensors = split_tensors(outputs)[0]
        pairs = [(t, g) for t, g in zip(tensors, grads) if g is not None and t.requires_grad]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        input_grads = [first.grad if block.input.requires_grad else None]
        input_grads += [t.grad if t.requires_grad else None for t in others]
        return (None, None, *input_grads)


def _module_of(function):
    """The nn.Module whose parameters `function` computes with, where it can be told."""
    while hasattr(function, "func") and hasattr(function, "keywords"):  # functools.partial
        function = function.func
    for candidate in (function, getattr(function, "__self__", None)):
        if isinstance(candidate, nn.Module):
            return candidate
        block = getattr(candidate, "block", None)  # our ForwardWrapper wrappers
        if isinstance(block, nn.Module):
            return block
    return None


def _trains_parameters(function) -> bool:
    module = _module_of(function)
    return module is None or any(p.requires_grad for p in module.parameters())


def reentrant_checkpoint(function, args, kwargs, manager=None, preserve_rng_state=True, scopes=None):
    """Runs function(*args, **kwargs) as one autograd node, offloading its first tensor input through
    `manager` (default: default_manager()) and recomputing it in backward. With grad disabled, or
    without any tensor argument, torch's checkpoint runs unchanged (as in checkpoint())."""
    tensors, template = split_tensors((args, kwargs))
    if not torch.is_grad_enabled() or not tensors:
        return torch_checkpoint(function, *args, use_reentrant=False, preserve_rng_state=preserve_rng_state,
                                **kwargs)
    manager = manager if manager is not None else default_manager()
    first = tensors[0]
    block = _Block()
    block.function, block.template = function, template
    block.input = OffloadedInput(first, manager.id())
    block.replay = ReplayState(block.input.device.type, tensors, preserve_rng_state)
    forward_scope, block.recompute_scope = (scopes or _no_scopes)()
    others = list(tensors[1:])
    if not any(t.requires_grad for t in tensors) and _trains_parameters(function):
        # Without an input that requires grad the node would not be in the graph at all, and the
        # block's parameters would get no gradient: a zero-size stand-in puts it there.
        others.append(torch.empty(0, device=block.input.device, requires_grad=True))
    outputs = _OffloadedRecompute.apply(block, forward_scope, first, *others)
    # The copy of the input finished while the block ran: release its device memory in stream order.
    manager.finish_save(block.input.handle)
    return with_tensors(block.out_template, outputs)
