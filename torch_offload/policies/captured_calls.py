"""One call inside our non-reentrant checkpoint (nonreentrant.py) whose saves are offloaded in
forward and stood in for in the recompute, without running the call again and without a dispatch
mode: the fused attention call and the projections' linear calls of the named selective policies
(interception.py).

Forward: the call runs as it is while the checkpoint's frame keeps the tensors it saves
(CheckpointFrame.begin_capture / end_capture). Each is either one of the call's own tensor arguments
or a view of one (the attention's query, key, value, mask; a linear's flattened input and transposed
weight: the recompute has them again), or something the call made (its output, the logsumexp, RNG
seeds): those are packed by the checkpoint's offload store (store.OffloadStore: offloaded through the
engine, or kept when under min_bytes; store.KeptStore: kept on the device), and so is the call's
output if it was not among the saves. Recompute: the call does not run; each save is handed to the
frame in the forward's order (CheckpointFrame.record), the arguments and their views as recomputed and
the rest restored, and the restored output is returned for the rest of the block to recompute from.

The dispatch-mode path (interception._FusedOutputs) does the same where there is no frame (the
reentrant variant, torch's checkpoint), at tens of microseconds of Python dispatch per op of the
call, twice per block.
"""
import torch

from .._library.dispatch_modes import outside_dispatch_modes

# In a store's record list: the call went through the dispatch mode in forward (interception.py), and
# goes through it again in the recompute.
DISPATCHED = object()


class _StoodIn:
    """The forward's record of one captured call: its saves, in order, each ("arg", position),
    ("view", _View) or ("held", what the store packed); the output's position among them (or its
    own packing)."""

    __slots__ = ("saves", "out_position", "out_held", "out_requires_grad")


class _View:
    """A save that is a view of one of the call's tensor arguments: where it lies in the argument's
    memory, and the argument's own layout then (the recompute's argument must have it too)."""

    __slots__ = ("position", "size", "stride", "offset", "arg_stride", "arg_offset")

    def of(self, arg):
        """The save again, from the recomputed argument; None where that has another layout."""
        if arg.stride() != self.arg_stride or arg.storage_offset() != self.arg_offset:
            return None
        return arg.detach().as_strided(self.size, self.stride, self.offset)


def _view_of(tensor, call_tensors):
    """The _View of `tensor` where it is a plain view of one of `call_tensors` (same memory and
    dtype), else None."""
    base = tensor._base
    if base is None or type(tensor) is not torch.Tensor:
        return None
    for position, arg in enumerate(call_tensors):
        if (arg is base or arg._base is base) and arg.dtype == tensor.dtype:
            view = _View()
            view.position, view.size, view.stride = position, tensor.size(), tensor.stride()
            view.offset, view.arg_stride, view.arg_offset = tensor.storage_offset(), arg.stride(), arg.storage_offset()
            return view
    return None


def run_captured(frame, store, function, args, kwargs, call_tensors):
    """Forward: function(*args, **kwargs) with its saves captured and packed into `store`."""
    frame.begin_capture()
    try:
        out = function(*args, **kwargs)
    finally:
        captured = frame.end_capture()
    record = _StoodIn()
    record.saves, record.out_position, record.out_held = [], None, None
    record.out_requires_grad = out.requires_grad
    with outside_dispatch_modes():
        for tensor in captured:
            position = next((i for i, arg in enumerate(call_tensors) if tensor is arg), None)
            if position is not None:
                record.saves.append(("arg", position))
                continue
            view = _view_of(tensor, call_tensors)
            if view is not None:
                record.saves.append(("view", view))
                continue
            if tensor is out:
                record.out_position = len(record.saves)
            # Without its autograd history: the engine may hold what it copies a while, and the
            # graph holds this checkpoint's frame.
            record.saves.append(("held", store.pack(tensor.detach())))
        if record.out_position is None:
            record.out_held = store.pack(out.detach())
    store.stood_in.append(record if captured else None)
    return out


def stand_in(frame, store, call_tensors):
    """Recompute: the captured call's saves handed to `frame` and its output restored; None where the
    forward captured nothing (the call saved through other hooks) or an argument a save is a view of
    has another layout now: then the caller runs the call."""
    if not store.stood_in:
        raise RuntimeError("torch_offload selective offload: trying to backward an extra time; a region under "
                           "selective checkpointing can be backpropagated once (or the recompute made a call "
                           "the forward did not)")
    record = store.stood_in.pop(0)
    if record is None:
        return None
    with outside_dispatch_modes():
        values = []
        for kind, x in record.saves:
            if kind == "arg":
                values.append(call_tensors[x])
            elif kind == "view":
                value = x.of(call_tensors[x.position])
                if value is None:  # the argument's layout changed: the call runs again
                    return None
                values.append(value)
            else:
                values.append(store.unpack(x))
        out = values[record.out_position] if record.out_position is not None else store.unpack(record.out_held)
    out = out.detach().requires_grad_(record.out_requires_grad)
    for value in values:  # the last one ends the recompute (early stop) if the block saves nothing after
        frame.record(value)
    return out
