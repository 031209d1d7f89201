"""checkpoint(): gradient checkpointing that keeps the checkpoint's first tensor input (a layer's
hidden_states) in host memory instead of on the GPU, and recomputes the layer in backward.

A drop-in for torch.utils.checkpoint.checkpoint: same signature, same keywords with the same
meaning, all handled here and never passed to the user's function. The non-reentrant checkpoint is
torch's algorithm with its per-tensor hooks in C (nonreentrant.py; torch's own implementation runs
it for debug=True, under torch.compile, and where the C hooks are not built), so it has torch's
semantics (RNG and autocast replay, any nest of inputs and outputs, keyword arguments, inputs that
do not require grad, context_fn / selective checkpointing, the determinism check, early stop, one
recompute per backward) at a lower host cost per saved tensor. What we change is what the
checkpoint stores to recompute from: instead of the first tensor input itself, the host handle
returned by offload_save.
The forward runs on the real input; the recompute runs on offload_restore(handle), which also starts
prefetching the input of the previous checkpoint. A DTensor input (sequence or context parallel
hidden states, sharded on the sequence dim) is offloaded as its local shard and rebuilt as the same
DTensor in the recompute (_library/dtensors.py).
"""
import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint
from torch.utils.checkpoint import noop_context_fn
from torch.utils import checkpoint as torch_checkpoint_module

from .block_input import OffloadedInput
from .flat_args import split_tensors, with_tensors
from .._library.manager import default_manager
from .nonreentrant import available as c_checkpoint_hooks_available
from .nonreentrant import checkpoint_without_reentrant
from .reentrant import reentrant_checkpoint


def checkpoint(function, *args, use_reentrant=None, context_fn=noop_context_fn, determinism_check="default",
               debug=False, early_stop=True, preserve_rng_state=True, manager=None, **kwargs):
    """Drop-in for torch.utils.checkpoint.checkpoint that offloads the first tensor input.

    Runs `function(*args, **kwargs)` without keeping its intermediate activations; the first tensor
    among args, then kwargs, is copied to host memory (pinned, asynchronously, on a side stream)
    and brought back, prefetched, when backward recomputes `function`. On CPU the "offload" is a
    host-to-host copy, so results are identical and the same code runs everywhere.

    Keywords as in torch.utils.checkpoint.checkpoint (context_fn, determinism_check, debug,
    early_stop, preserve_rng_state), plus `manager` (default: torch_offload.default_manager()).
    use_reentrant=None (torch would warn and pick the reentrant variant) and False run the
    non-reentrant checkpoint; use_reentrant=True runs our reentrant variant (reentrant.py: one
    autograd node per call, cheaper on the host; gradients through .backward() only, and no
    context_fn= or debug=, as in torch).
    With grad disabled, or without any tensor argument, torch's checkpoint runs unchanged.
    """
    if use_reentrant and (context_fn is not noop_context_fn or debug is not False):
        raise ValueError("torch_offload.checkpoint: context_fn= and debug= are only taken with "
                         "use_reentrant=False (as in torch.utils.checkpoint.checkpoint)")
    if use_reentrant:
        return reentrant_checkpoint(function, args, kwargs, manager, preserve_rng_state)
    options = dict(use_reentrant=False, context_fn=context_fn, determinism_check=determinism_check,
                   debug=debug, early_stop=early_stop, preserve_rng_state=preserve_rng_state)
    tensors, template = split_tensors((args, kwargs))
    if not torch.is_grad_enabled() or not tensors:  # nothing to offload: torch's own behaviour
        return torch_checkpoint(function, *args, **options, **kwargs)
    manager = manager if manager is not None else default_manager()
    first = tensors[0]
    saved = OffloadedInput(first, manager.id())
    pending = {"input": first}  # the real input, for the forward run only

    def run(_handle, _device_anchor, *other_tensors):
        x = pending.pop("input", None)
        if x is None:  # recompute in backward: the input comes back from host memory
            x = saved.restore()
        call_args, call_kwargs = with_tensors(template, (x, *other_tensors))
        return function(*call_args, **call_kwargs)

    # torch's checkpoint stashes the RNG state of the devices its tensor arguments live on; the
    # handle is on the host, so a zero-size tensor on the input's device stands in for it.
    device_anchor = torch.empty(0, device=saved.device)
    del first  # from here on only `pending` (until the forward run) and the handle refer to it
    if _c_hooks_serve(debug):
        output = checkpoint_without_reentrant(run, (saved.handle, device_anchor, *tensors[1:]), {}, saved.device.type,
                                              (device_anchor, *tensors[1:]), preserve_rng_state, context_fn,
                                              determinism_check, early_stop)
    else:
        output = torch_checkpoint(run, saved.handle, device_anchor, *tensors[1:], **options)
    pending.clear()
    # Release the device copy of the input in stream order now rather than when the background
    # releaser observes the copy's event: the copy finished while the block ran.
    manager.finish_save(saved.handle)
    return output


def _c_hooks_serve(debug) -> bool:
    """Whether our non-reentrant checkpoint (nonreentrant.py, hooks in C) runs this call rather than
    torch's: not for debug=True (torch's operator traces), nor under torch.compile (torch's
    checkpoint is a higher-order op there), nor where the C hooks are not built."""
    debugging = torch_checkpoint_module._checkpoint_debug_enabled
    debugging = debug if debugging is None else debugging
    return not debugging and not torch.compiler.is_compiling() and c_checkpoint_hooks_available()
