"""The non-reentrant checkpoint that checkpoint() runs: torch's algorithm and semantics, with the
per-tensor hooks in C.

torch's non-reentrant checkpoint saves nothing of the checkpointed function but a placeholder per
saved tensor, and recomputes the function on the first unpack of each backward, keeping what the
recompute saves for the unpacks that follow. It does that in three Python hooks per saved tensor
(the forward's save, the backward's unpack, the recompute's save). Where the step is bound by the
host (short sequences: at 4k tokens the GPU idles a third of a checkpointed step on the reference
model) those calls are a large part of the step. Here they are C calls
(pyext/checkpoint_frame.cpp: CheckpointFrame); what runs once per checkpoint call stays in Python:
the RNG and autocast state of the forward (replay_state.py), the contexts of context_fn, and the
recompute itself.

Same as torch (torch/utils/checkpoint.py, _checkpoint_without_reentrant_generator): one recompute
per backward (graph task or GraphExecGroup), early stop (and set_checkpoint_early_stop), the
determinism check ("default": count, shapes, dtypes and devices; "none") with torch's
CheckpointError, context_fn's forward and recompute contexts, RNG and autocast replay, a
torch.device context. Different: the function's inputs are held by the checkpoint itself, not saved
through autograd, so an outer saved-tensor hook (another checkpoint around this one, save_on_cpu)
does not see them; checkpoint() uses torch's own implementation where that matters (debug=True, no
C hooks built) and under torch.compile.
"""
import contextlib
import threading

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.utils import checkpoint as torch_checkpoint_module

from .._library.loading import load_save_hooks
from .replay_state import ReplayState

DETERMINISM_CHECKS = ("default", "none")
_running = threading.local()  # .frames: the frames whose forward or recompute runs in this thread


def _run(stack: contextlib.ExitStack, frame) -> None:
    """`frame` is this thread's current frame until `stack` closes (current_frame())."""
    frames = getattr(_running, "frames", None)
    if frames is None:
        frames = _running.frames = []
    frames.append(frame)
    stack.callback(frames.pop)


def current_frame():
    """The CheckpointFrame whose forward or recompute runs in this thread now (the innermost), or
    None. A caller inside the function may capture what a call saves in forward and stand in for it
    in the recompute (policies/interception.py)."""
    frames = getattr(_running, "frames", None)
    return frames[-1] if frames else None


def frame_of_context():
    """In a context_fn context's __enter__: the frame of the checkpoint entering it, when that is this
    one (None when torch's checkpoint or our reentrant variant enters it)."""
    return getattr(_running, "entering", None)


def _enter(stack: contextlib.ExitStack, context, frame) -> None:
    _running.entering = frame
    try:
        stack.enter_context(context)
    finally:
        _running.entering = None


def available() -> bool:
    """Whether the C hooks are built (they are wherever the C save hooks are)."""
    hooks = load_save_hooks()
    return hooks is not None and hasattr(hooks, "CheckpointFrame")


def _as_saved(x):  # the recompute's unpack hook: its graph is only backwarded with retain_graph
    return x


def _device_context():
    """The torch.device context the forward runs under, to recompute under it too (as torch does)."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext
    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, DeviceContext):
            return mode
    return contextlib.nullcontext()


def checkpoint_without_reentrant(function, args, kwargs, device_type: str, tensors, preserve_rng_state=True,
                                 context_fn=torch_checkpoint_module.noop_context_fn,
                                 determinism_check="default", early_stop=True):
    """Runs function(*args, **kwargs), keeping none of what it saves; backward recomputes it.
    `tensors`: the tensor arguments whose devices' RNG states are stashed."""
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check should be one of {list(DETERMINISM_CHECKS)}, but got {determinism_check}")
    hooks = load_save_hooks()
    forced_early_stop = torch_checkpoint_module._enable_checkpoint_early_stop  # set_checkpoint_early_stop
    early_stop = forced_early_stop if forced_early_stop is not None else early_stop
    forward_context, recompute_context = context_fn()
    replay = ReplayState(device_type, tensors, preserve_rng_state)
    device_context = _device_context()
    stop = hooks.StopRecompute

    def recompute(frame):
        try:
            with saved_tensors_hooks(frame.record, _as_saved), torch.enable_grad(), \
                    contextlib.ExitStack() as stack:
                _run(stack, frame)
                replay.enter(stack)
                _enter(stack, recompute_context, frame)
                stack.enter_context(device_context)
                function(*args, **kwargs)
        except stop:
            pass

    frame = hooks.CheckpointFrame(recompute, determinism_check == "default", bool(early_stop))
    with saved_tensors_hooks(frame.pack, frame.unpack), contextlib.ExitStack() as stack:
        _run(stack, frame)
        _enter(stack, forward_context, frame)
        output = function(*args, **kwargs)
    frame.finish_forward()
    return output
