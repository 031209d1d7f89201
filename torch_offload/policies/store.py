"""What one checkpointed block offloads or keeps under a selective policy, shared by its forward and
its recompute: the outputs of the op calls the policy names, in call order per op.

OffloadStore offloads each output through the engine in forward (offload_save; outputs under
min_bytes stay on the device) and restores it in the recompute, with its sizes and strides.
KeptStore ("keep_<group>" projection groups) keeps the outputs on the device instead: an alias, no
copy, handed back in the recompute unless something changed it in place meanwhile.
"""
from collections import defaultdict

import torch
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import CheckpointPolicy

from .._library.dispatch_modes import outside_dispatch_modes
from .._library.layouts import Packed, compact_recipe, compact_with, rebuild



class OffloadStore:
    """The outputs of offloaded op calls, in call order per op, shared by the forward and the
    recompute mode of one checkpoint; and the decision torch's mode reads next."""

    def __init__(self, manager, min_bytes, finish_at_end=False):
        self.manager = manager  # alive as long as handles it saved
        self.manager_id = manager.id()
        self.min_bytes = min_bytes
        self.calls = defaultdict(list)
        self.stood_in = []  # the captured calls (captured_calls.py), in call order
        # handles offloaded by this forward, until finish_saves() (where the caller calls it)
        self.in_forward = [] if finish_at_end else None
        self.decision = None

    def take_decision(self, ctx, op, *args, **kwargs):  # torch's policy: what our mode decided
        decision, self.decision = self.decision, None
        return decision if decision is not None else CheckpointPolicy.PREFER_RECOMPUTE

    def save(self, op, out):
        with outside_dispatch_modes():  # modes below ours (torch's SAC) must not see our ops
            self.calls[op].append(self._map(self.pack, out))

    def restore(self, op):
        calls = self.calls.get(op)
        if calls is None:
            raise RuntimeError(f"torch_offload selective offload: {op} is offloaded by the policy in the "
                               "recompute but was not in forward (the policy must decide alike in both)")
        if not calls:
            raise RuntimeError("torch_offload selective offload: trying to backward an extra time; a region "
                               "under selective checkpointing can be backpropagated once")
        with outside_dispatch_modes():
            return self._map(self.unpack, calls.pop(0))

    @staticmethod
    def _map(fn, out):
        # An op returns a tensor or a flat tuple (the fused attention ops: tensors and ints); the
        # generic tree_map costs more than the rest of the save.
        if type(out) is tuple:
            return tuple(fn(value) for value in out)
        return fn(out) if isinstance(out, torch.Tensor) else tree_map(fn, out)

    def pack(self, value):
        """One output as this store keeps it: offloaded, or detached where under min_bytes."""
        if not isinstance(value, torch.Tensor):
            return value
        if value.numel() == 0 or value.numel() * value.element_size() < self.min_bytes or value.layout != torch.strided:
            return value.detach()
        if value.is_contiguous():  # the common case: restored as it is
            return _Held(Packed(self._offload(value), value.device, None, None), None)
        # A layout that is neither dense nor a permutation of dense comes back contiguous from
        # rebuild(): then the strides are remembered, to restore them.
        permutation, expanded_sizes, exact = compact_recipe(value)
        source = compact_with(value, permutation, expanded_sizes)
        packed = Packed(self._offload(source), value.device, permutation, expanded_sizes)
        return _Held(packed, None if exact else (value.shape, value.stride()))

    def _offload(self, source):
        """offload_save's handle for `source`, remembered for finish_saves() in a block's forward."""
        handle = torch.ops.offload.offload_save(source, self.manager_id)
        if self.in_forward is not None:
            self.in_forward.append(handle)
        return handle

    def finish_saves(self):
        """At the end of the block's forward: the device memory of what it offloaded is released in
        stream order now (as the block input's is), not when a later call of the manager finds the
        copy done: otherwise the last block's outputs could still be held when backward begins."""
        if self.in_forward is None:
            return
        for handle in self.in_forward:
            self.manager.finish_save(handle)
        self.in_forward.clear()

    def unpack(self, value):
        """The output that pack() gave `value` for, on its device again."""
        if not isinstance(value, _Held):
            return value
        restored = rebuild(torch.ops.offload.offload_restore(value.packed.handle, value.packed.device, self.manager_id),
                           value.packed)
        if value.layout is not None:
            shape, stride = value.layout
            restored = torch.empty_strided(shape, stride, dtype=restored.dtype, device=restored.device).copy_(restored)
        return restored


class KeptBytes:
    """The bytes of products KeptStores kept on the device, as a stats source of their manager
    (stats()[KeptBytes.STAT]: manager.register_stats_source)."""

    STAT = "policy_kept_bytes"  # the one statistic the Python package adds to the engine's

    def __init__(self):
        self.bytes = 0

    def snapshot(self) -> dict:
        return {self.STAT: self.bytes}

    def reset(self) -> None:
        self.bytes = 0


class KeptStore(OffloadStore):
    """The outputs a policy keeps on the device ("keep_<group>" projection groups): aliases of them,
    no copy, handed back in the recompute unless something modified them in place meanwhile."""

    def __init__(self, manager, kept_bytes: KeptBytes = None):
        super().__init__(manager, min_bytes=0)
        self.kept_bytes = kept_bytes  # counts what pack() keeps, where given
        self._last = None  # the _KeptTensor packed last, for watch()

    # Held: an alias without autograd history (the op's own output gets the forward's grad_fn, and
    # holding it would close a cycle through that graph and this checkpoint that passes through C++,
    # so a forward never backpropagated would keep it forever).
    def pack(self, value):
        if not isinstance(value, torch.Tensor):
            return value
        if self.kept_bytes is not None:
            self.kept_bytes.bytes += value.numel() * value.element_size()
        self._last = _KeptTensor(value.detach())
        return self._last

    def watch(self, output: torch.Tensor) -> None:
        """Called above autograd with what the caller got back (for a Linear on 3-D input, a view of
        the kept product that does not share its version counter): an in-place change to it before
        the recompute is an error there. The alias shares its version counter, not its graph."""
        if self._last is not None:
            self._last.watched, self._last.version = output.detach(), output._version
            self._last = None

    def unpack(self, value):
        if not isinstance(value, _KeptTensor):
            return value
        watched = value.watched
        if watched is not None and watched._version != value.version:
            raise RuntimeError("torch_offload selective offload: a product the policy keeps on the device "
                               f"(a 'keep_' projection group) was modified in place after it was kept (version "
                               f"{value.version} -> {watched._version}); keep a group whose products are not "
                               "changed in place")
        return value.tensor


class _KeptTensor:
    __slots__ = ("tensor", "watched", "version")

    def __init__(self, tensor):
        self.tensor, self.watched, self.version = tensor, None, 0


class _Held:
    """An offloaded output: its host handle and view recipe, and its strides where the recipe
    does not give them back."""

    __slots__ = ("packed", "layout")

    def __init__(self, packed, layout):
        self.packed = packed
        self.layout = layout
