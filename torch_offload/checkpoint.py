"""checkpoint(): gradient checkpointing that keeps the checkpoint's first tensor input (a layer's
hidden_states) in host memory instead of on the GPU, and recomputes the layer in backward.

It is a reentrant-style checkpoint (an autograd.Function), like torch.utils.checkpoint with
use_reentrant=True, with these differences: the first tensor input is offloaded through
offload_save / offload_restore; keyword arguments and tensors nested in lists, tuples and dicts are
supported (they are flattened); it works when no input requires grad (parameters inside `function`
still get gradients); outputs may be any nest of tensors and other values.
"""
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.checkpoint import get_device_states, set_device_states

from ._ops import offload_restore, offload_save
from .manager import default_manager

# Fed to the Function when no real input requires grad, so that backward still runs and the
# parameters used inside `function` get their gradients.
_REQUIRES_GRAD_ANCHOR = torch.empty(0, requires_grad=True)


def _autocast_state(device_type):
    return {
        "device_type": device_type,
        "enabled": torch.is_autocast_enabled(device_type),
        "dtype": torch.get_autocast_dtype(device_type),
        "cache_enabled": torch.is_autocast_cache_enabled(),
    }


_TENSOR = object()  # marks where a tensor stood among flattened leaves


class _OffloadCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function, manager, preserve_rng_state, call, *tensors):
        # `call` describes the original arguments: their pytree spec, the flat leaves with tensors
        # replaced by _TENSOR, the number of real tensors (an anchor may follow them), and it
        # receives the output structure.
        ctx.function = function
        ctx.manager = manager
        ctx.call = call
        ctx.preserve_rng_state = preserve_rng_state
        ctx.num_tensor_args = len(tensors)
        real = tensors[: call["num_tensors"]]
        if preserve_rng_state:
            ctx.cpu_rng_state = torch.get_rng_state()
            ctx.rng_devices, ctx.device_rng_states = get_device_states(*real)
        ctx.autocast = [_autocast_state("cuda"), _autocast_state("cpu")]

        first = real[0]
        ctx.first_device = first.device
        ctx.first_requires_grad = first.requires_grad
        handle = offload_save(first.detach(), manager.id())
        ctx.save_for_backward(handle, *real[1:])

        with torch.no_grad():
            outputs = _call(function, call, real)
        flat_out, out_spec = tree_flatten(outputs)
        call["out_spec"] = out_spec
        call["out_leaves"] = [_TENSOR if isinstance(v, torch.Tensor) else v for v in flat_out]
        return tuple(v for v in flat_out if isinstance(v, torch.Tensor))

    @staticmethod
    def backward(ctx, *grad_outputs):
        handle, *rest = ctx.saved_tensors
        first = offload_restore(handle, ctx.first_device, ctx.manager.id())
        first.requires_grad_(ctx.first_requires_grad)
        inputs = [first] + [t.detach().requires_grad_(t.requires_grad) for t in rest]

        rng_devices = ctx.rng_devices if ctx.preserve_rng_state else []
        with torch.random.fork_rng(devices=rng_devices, enabled=ctx.preserve_rng_state):
            if ctx.preserve_rng_state:
                torch.set_rng_state(ctx.cpu_rng_state)
                if rng_devices:
                    set_device_states(rng_devices, ctx.device_rng_states)
            with torch.enable_grad(), torch.autocast(**ctx.autocast[0]), torch.autocast(
                **ctx.autocast[1]
            ):
                outputs = _call(ctx.function, ctx.call, inputs)

        out_tensors = [v for v in tree_flatten(outputs)[0] if isinstance(v, torch.Tensor)]
        pairs = [
            (out, grad)
            for out, grad in zip(out_tensors, grad_outputs)
            if out.requires_grad and grad is not None
        ]
        if pairs:
            torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
        input_grads = [t.grad if t.requires_grad else None for t in inputs]
        anchors = (None,) * (ctx.num_tensor_args - len(inputs))
        return (None, None, None, None, *input_grads, *anchors)


def _call(function, call, tensors):
    leaves = list(call["leaves"])
    it = iter(tensors)
    leaves = [next(it) if v is _TENSOR else v for v in leaves]
    args, kwargs = tree_unflatten(leaves, call["spec"])
    return function(*args, **kwargs)


def checkpoint(function, *args, manager=None, preserve_rng_state=True, **kwargs):
    """Drop-in for torch.utils.checkpoint.checkpoint that offloads the first tensor input.

    Runs `function(*args, **kwargs)` without keeping its intermediate activations; the first tensor
    among args/kwargs is copied to host memory (pinned, asynchronously, on a side stream) and
    brought back, prefetched, when backward recomputes `function`. With grad disabled it simply
    calls `function`. On CPU the "offload" is a host-to-host copy, so results are identical and the
    same code runs everywhere.
    """
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    leaves, spec = tree_flatten((args, kwargs))
    tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
    if not tensors:
        return function(*args, **kwargs)
    call = {
        "spec": spec,
        "leaves": [_TENSOR if isinstance(v, torch.Tensor) else v for v in leaves],
        "num_tensors": len(tensors),
    }
    if not any(t.requires_grad for t in tensors):
        tensors.append(_REQUIRES_GRAD_ANCHOR)
    outs = _OffloadCheckpoint.apply(
        function, manager if manager is not None else default_manager(), preserve_rng_state, call, *tensors
    )
    it = iter(outs)
    out_leaves = [next(it) if v is _TENSOR else v for v in call["out_leaves"]]
    return tree_unflatten(out_leaves, call["out_spec"])
