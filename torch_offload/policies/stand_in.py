"""One call inside our non-reentrant checkpoint (nonreentrant.py) whose saves are offloaded in
forward and stood in for in the recompute, without running the call again and without a dispatch
mode: the fused attention call of the named selective policies (interception.py).

Forward: the call runs as it is while the checkpoint's frame keeps the tensors it saves
(CheckpointFrame.begin_capture / end_capture). Each is either one of the call's own tensor arguments
(the attention's query, key, value, mask: the recompute has them again) or something the call made
(its output, the logsumexp, RNG seeds): those are packed by the checkpoint's offload store
(store.OffloadStore: offloaded through the engine, or kept when under min_bytes), and so is the
call's output if it was not among the saves. Recompute: the call does not run; each save is handed to
the frame in the forward's order (CheckpointFrame.record), the arguments as recomputed and the rest
restored, and the restored output is returned for the rest of the block to recompute from.

The dispatch-mode path (_FusedOutputs) does the same where there is no frame (the reentrant variant,
torch's checkpoint), at tens of microseconds of Python dispatch per op of the call, twice per block.
"""
from .._engine.dispatch_modes import outside_dispatch_modes


class _StoodIn:
    """The forward's record of one captured call: its saves, in order, each ("arg", position) or
    ("held", what the store packed); the output's position among them (or its own packing)."""

    __slots__ = ("saves", "out_position", "out_held", "out_requires_grad")


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
    forward captured nothing (the call saved through other hooks): then the caller runs it."""
    if not store.stood_in:
        raise RuntimeError("torch_offload selective offload: trying to backward an extra time; a region under "
                           "selective checkpointing can be backpropagated once (or the recompute made a call "
                           "the forward did not)")
    record = store.stood_in.pop(0)
    if record is None:
        return None
    with outside_dispatch_modes():
        values = [call_tensors[x] if kind == "arg" else store.unpack(x) for kind, x in record.saves]
        out = values[record.out_position] if record.out_position is not None else store.unpack(record.out_held)
    out = out.detach().requires_grad_(record.out_requires_grad)
    for value in values:  # the last one ends the recompute (early stop) if the block saves nothing after
        frame.record(value)
    return out
