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

Tested: fp32 gradients bit-equal to torch's checkpoints (python_tests/test_reentrant.py), under
FSDP2 (python_tests/fsdp2_cases.py) and with a sequence-parallel DTensor block input, offloaded as
its local shard as in checkpoint() (python_tests/tp_cases.py).

`scopes` (optional): a function returning the forward and the recompute context of one block, like
a context_fn; the selective "attention" policies pass theirs (attention_offload.py) so that the
block's attention outputs are offloaded in forward and restored instead of recomputed.
"""
import contextlib

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import get_device_states, set_device_states

from ._ops import offload_restore, offload_save
from . import node_budget
from .dtensors import join_local, split_local
from .flat_args import flatten, unflatten

_TENSOR = object()  # marks where a tensor stood among flattened leaves


def _no_scopes():
    return contextlib.nullcontext(), contextlib.nullcontext()


class _Block:
    """What the backward of one block needs besides its saved tensors."""

    __slots__ = ("function", "template", "spec", "handle", "handle_device", "manager_id", "dtensor_spec",
                 "first_requires_grad", "device_type", "autocast", "rng", "recompute_scope", "out_template",
                 "out_spec")


def _autocast_state(device_type: str):
    """The autocast settings in force now, for the device and for the CPU, to re-enter in backward."""
    def state(kind):
        return dict(enabled=torch.is_autocast_enabled(kind), dtype=torch.get_autocast_dtype(kind),
                    cache_enabled=torch.is_autocast_cache_enabled())
    return state(device_type) if device_type != "cpu" else None, state("cpu")


class _OffloadedRecompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, block: _Block, forward_scope, first, *others):
        ctx.block = block
        ctx.set_materialize_grads(False)  # outputs without a gradient are left out of backward
        ctx.save_for_backward(*others)
        it = iter((first, *others))
        args, kwargs = unflatten([next(it) if v is _TENSOR else v for v in block.template], block.spec)
        with forward_scope:
            outputs = block.function(*args, **kwargs)
        leaves, block.out_spec = flatten(outputs)
        block.out_template = [_TENSOR if isinstance(v, torch.Tensor) else v for v in leaves]
        return tuple(v for v in leaves if isinstance(v, torch.Tensor))

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(
                "torch_offload.checkpoint(use_reentrant=True) (also apply(..., use_reentrant=True)) computes "
                "gradients through .backward() only: it cannot serve torch.autograd.grad() or backward(inputs=...). "
                "Use use_reentrant=False (the default), or call .backward() without inputs=")
        block = ctx.block
        saved = ctx.saved_tensors
        with _disable_current_modes():
            restored = offload_restore(block.handle, block.handle_device, block.manager_id)
        first = join_local(restored, block.dtensor_spec).requires_grad_(block.first_requires_grad)
        others = [t.detach().requires_grad_(t.requires_grad) if t is not None else None for t in saved]
        it = iter((first, *others))
        args, kwargs = unflatten([next(it) if v is _TENSOR else v for v in block.template], block.spec)
        device_autocast, cpu_autocast = block.autocast
        with contextlib.ExitStack() as stack:
            if block.rng is not None:
                cpu_state, devices, device_states = block.rng
                stack.enter_context(torch.random.fork_rng(devices=devices, device_type=block.device_type))
                torch.set_rng_state(cpu_state)
                if devices:
                    set_device_states(devices, device_states, device_type=block.device_type)
            stack.enter_context(torch.enable_grad())
            # Autocast as in forward (entered only where it differs from now: the usual case, no
            # autocast, costs nothing).
            if device_autocast is not None and device_autocast != _autocast_state(block.device_type)[0]:
                stack.enter_context(torch.amp.autocast(block.device_type, **device_autocast))
            if cpu_autocast != _autocast_state("cpu")[1]:
                stack.enter_context(torch.amp.autocast("cpu", **cpu_autocast))
            stack.enter_context(block.recompute_scope)
            outputs = block.function(*args, **kwargs)
        tensors = [v for v in flatten(outputs)[0] if isinstance(v, torch.Tensor)]
        pairs = [(t, g) for t, g in zip(tensors, grads) if g is not None and t.requires_grad]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        input_grads = [first.grad if block.first_requires_grad else None]
        input_grads += [t.grad if t is not None and t.requires_grad else None for t in others]
        return (None, None, *input_grads)


def _module_of(function):
    """The nn.Module whose parameters `function` computes with, where it can be told."""
    while hasattr(function, "func") and hasattr(function, "keywords"):  # functools.partial
        function = function.func
    for candidate in (function, getattr(function, "__self__", None)):
        if isinstance(candidate, nn.Module):
            return candidate
        block = getattr(candidate, "block", None)  # our BlockForward wrappers
        if isinstance(block, nn.Module):
            return block
    return None


def _trains_parameters(function) -> bool:
    module = _module_of(function)
    return module is None or any(p.requires_grad for p in module.parameters())


def reentrant_checkpoint(function, args, kwargs, manager, preserve_rng_state=True, scopes=None):
    """Runs function(*args, **kwargs) as one autograd node, offloading its first tensor input through
    `manager` and recomputing it in backward. Called with grad enabled and at least one tensor."""
    leaves, spec = flatten((args, kwargs))
    tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
    first = tensors[0]
    local, dtensor_spec = split_local(first.detach())
    manager_id = manager.id()
    try:
        handle = offload_save(local, manager_id)
    except RuntimeError as error:
        node_budget.name_in_error(error, manager_id)
        raise
    block = _Block()
    block.function, block.spec, block.handle, block.manager_id = function, spec, handle, manager_id
    block.template = [_TENSOR if isinstance(v, torch.Tensor) else v for v in leaves]
    block.dtensor_spec, block.first_requires_grad, block.handle_device = dtensor_spec, first.requires_grad, local.device
    block.device_type = local.device.type
    block.autocast = _autocast_state(block.device_type)
    block.rng = None
    if preserve_rng_state:
        devices, states = get_device_states(*tensors) if block.device_type != "cpu" else ([], [])
        block.rng = (torch.get_rng_state(), devices, states)
    forward_scope, block.recompute_scope = (scopes or _no_scopes)()
    others = list(tensors[1:])
    if not any(t.requires_grad for t in tensors) and _trains_parameters(function):
        # Without an input that requires grad the node would not be in the graph at all, and the
        # block's parameters would get no gradient: a zero-size stand-in puts it there.
        others.append(torch.empty(0, device=local.device, requires_grad=True))
    del local
    outputs = _OffloadedRecompute.apply(block, forward_scope, first, *others)
    # The copy of the input finished while the block ran: release its device memory in stream order.
    manager.finish_save(handle)
    it = iter(outputs)
    return unflatten([next(it) if v is _TENSOR else v for v in block.out_template], block.out_spec)
