"""Selective offload: inside a checkpointed block a policy decides, per op output, whether it is kept
on the device (CheckpointPolicy.MUST_SAVE / PREFER_SAVE), recomputed in backward
(MUST_RECOMPUTE / PREFER_RECOMPUTE) or offloaded through our engine (MUST_CPU_OFFLOAD /
PREFER_CPU_OFFLOAD): offload_save in forward, offload_restore in the recompute, so the pinned pool,
the in-flight bound and backward prefetch apply. Offloading what is costly to recompute and cheap to
move (the attention outputs) makes the recompute cheaper at the memory of hidden_states mode.

How: torch's selective checkpointing (create_selective_checkpoint_contexts) keeps and recomputes as
usual; one more dispatch mode above it serves the offload decisions. In forward it runs the op and
offloads its outputs; in the recompute it returns the restored outputs without running the op. For
every other op it hands the policy's decision down to torch's mode, so the user's policy is asked
once per op. Eager only (torch.compile: use torch_offload.compile).
"""
import functools
from collections import defaultdict

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import (SAC_IGNORED_OPS, CheckpointPolicy, SelectiveCheckpointContext,
                                    create_selective_checkpoint_contexts)

from ._ops import offload_restore, offload_save, outside_dispatch_modes
from .activations import _Packed, _rebuild
from .attention_offload import (attention_offload_contexts, is_fast_policy, projection_groups, projection_weights,
                                split_kept)
from .checkpoint import checkpoint as offload_checkpoint
from .manager import default_manager
from .policies import resolve
from .reentrant import reentrant_checkpoint
from .saved_regions import compact_recipe, compact_with

_OFFLOAD = (CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD)
DEFAULT_MIN_BYTES = 1 << 16  # smaller outputs (dropout seeds, empty masks) stay on the device


class _Offloaded:
    """The outputs of offloaded op calls, in call order per op, shared by the forward and the
    recompute mode of one checkpoint; and the decision torch's mode reads next."""

    def __init__(self, manager, min_bytes, finish_at_end=False):
        self.manager = manager  # alive as long as handles it saved
        self.manager_id = manager.id()
        self.min_bytes = min_bytes
        self.calls = defaultdict(list)
        self.stood_in = []  # the captured calls (stand_in.py), in call order
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
            return _Held(_Packed(self._offload(value), value.device, None, None), None)
        # A layout that is neither dense nor a permutation of dense comes back contiguous from
        # _rebuild: then the strides are remembered, to restore them.
        permutation, expanded_sizes, exact = compact_recipe(value)
        source = compact_with(value, permutation, expanded_sizes)
        packed = _Packed(self._offload(source), value.device, permutation, expanded_sizes)
        return _Held(packed, None if exact else (value.shape, value.stride()))

    def _offload(self, source):
        """offload_save's handle for `source`, remembered for finish_saves() in a block's forward."""
        handle = offload_save(source, self.manager_id)
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
        restored = _rebuild(offload_restore(value.packed.handle, value.packed.device, self.manager_id), value.packed)
        if value.layout is not None:
            shape, stride = value.layout
            restored = torch.empty_strided(shape, stride, dtype=restored.dtype, device=restored.device).copy_(restored)
        return restored


_bytes_kept = [0]  # every byte _Kept held, in this process (mode="auto" reads it per step)


def bytes_kept() -> int:
    """Bytes of products kept on the device by "keep_<group>" policies so far, in this process."""
    return _bytes_kept[0]


class _Kept(_Offloaded):
    """The outputs a policy keeps on the device ("keep_<group>" projection groups): aliases of them,
    no copy, handed back in the recompute unless something modified them in place meanwhile."""

    def __init__(self, manager):
        super().__init__(manager, min_bytes=0)
        self._last = None  # the _KeptTensor packed last, for watch()

    # Held: an alias without autograd history (the op's own output gets the forward's grad_fn, and
    # holding it would close a cycle through that graph and this checkpoint that passes through C++,
    # so a forward never backpropagated would keep it forever).
    def pack(self, value):
        if not isinstance(value, torch.Tensor):
            return value
        _bytes_kept[0] += value.numel() * value.element_size()
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


class _OffloadMode(TorchDispatchMode):
    """Above torch's selective checkpointing modes: serves the policy's offload decisions."""

    def __init__(self, policy, offloaded: _Offloaded, is_recompute: bool):
        super().__init__()
        self.policy = policy
        self.offloaded = offloaded
        self.is_recompute = is_recompute

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SAC_IGNORED_OPS:
            return func(*args, **kwargs)
        decision = self.policy(SelectiveCheckpointContext(is_recompute=self.is_recompute), func, *args, **kwargs)
        if isinstance(decision, bool):
            decision = CheckpointPolicy.MUST_SAVE if decision else CheckpointPolicy.PREFER_RECOMPUTE
        # Ops whose outputs alias their inputs (views) are free to recompute: never offloaded.
        aliasing = isinstance(func, torch._ops.OpOverload) and any(r.alias_info is not None for r in func._schema.returns)
        if decision not in _OFFLOAD or aliasing:
            self.offloaded.decision = CheckpointPolicy.PREFER_RECOMPUTE if decision in _OFFLOAD else decision
            return func(*args, **kwargs)
        if self.is_recompute:
            return self.offloaded.restore(func)
        self.offloaded.decision = CheckpointPolicy.PREFER_RECOMPUTE  # torch's mode must not keep it too
        out = func(*args, **kwargs)
        self.offloaded.save(func, out)
        return out


class _Modes:
    """Enters torch's selective checkpointing mode, then ours on top of it."""

    def __init__(self, *modes):
        self.modes = modes

    def __enter__(self):
        for mode in self.modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self.modes):
            mode.__exit__(*exc)
        return False


def selective_offload_contexts(policy="attention", manager=None, min_bytes=DEFAULT_MIN_BYTES,
                               allow_cache_entry_mutation=False):
    """Like torch.utils.checkpoint.create_selective_checkpoint_contexts, for `context_fn=` of
    torch_offload.checkpoint (or torch's checkpoint): returns the forward and recompute contexts.

    policy: a name from torch_offload.policies.POLICIES ("attention", "attention_save"), a list of
    ops to keep (torch's meaning), or a function with torch's policy signature returning a
    CheckpointPolicy (MUST/PREFER_CPU_OFFLOAD: offloaded through `manager`) or a bool.
    min_bytes: tensors below it are kept on the device even when the policy offloads their op.
    """
    policy_fn = resolve(policy, "torch_offload.selective_offload_contexts")
    offloaded = _Offloaded(manager if manager is not None else default_manager(), min_bytes)
    keep_forward, keep_recompute = create_selective_checkpoint_contexts(
        offloaded.take_decision, allow_cache_entry_mutation=allow_cache_entry_mutation)
    return (_Modes(keep_forward, _OffloadMode(policy_fn, offloaded, is_recompute=False)),
            _Modes(keep_recompute, _OffloadMode(policy_fn, offloaded, is_recompute=True)))


def checkpoint(function, *args, policy="attention", manager=None, min_bytes=DEFAULT_MIN_BYTES, block=None,
               use_reentrant=False, **kwargs):
    """torch_offload.checkpoint (the first tensor input offloaded, the block recomputed in backward)
    with a selective offload policy inside the block; other keywords as in torch_offload.checkpoint.

    The named policies "attention" and "attention+<group>+..." ("attention_qkv" is "attention+qkv")
    intercept only the calls that matter (attention_offload.py); projection groups need the block's
    module, to find its projections: `function` itself when it is an nn.Module, else `block=`. A
    policy function takes the per-op path (dispatch modes).
    use_reentrant=True: the reentrant variant (reentrant.py; cheaper on the host, gradients through
    .backward() only), for the named policies."""
    if "context_fn" in kwargs:
        raise ValueError("torch_offload.selective_checkpoint: pass policy=, not context_fn=")
    manager = manager if manager is not None else default_manager()
    fast = is_fast_policy(policy)
    if use_reentrant and not fast:
        raise ValueError(f"torch_offload.selective_checkpoint: use_reentrant=True takes the named policies "
                         f"('attention', 'attention+qkv', ...), got policy={policy!r} (a policy function needs "
                         "use_reentrant=False)")
    if fast:  # intercepted calls, not a mode per op
        weights = kept_weights = ()
        groups = projection_groups(policy)
        if groups:
            block = block if block is not None else function
            if not isinstance(block, nn.Module):
                raise ValueError(f"torch_offload.selective_checkpoint(policy={policy!r}): pass the block as "
                                 "`function` (an nn.Module) or as block=, to find its projections")
            offloaded_groups, kept_groups = split_kept(groups)
            weights = projection_weights(block, offloaded_groups)
            kept_weights = projection_weights(block, kept_groups)
        store = _Offloaded(manager, min_bytes, finish_at_end=True)
        context_fn = functools.partial(attention_offload_contexts, store, weights,
                                       _Kept(manager) if kept_weights else None, kept_weights)
    else:
        store = None  # made per call by selective_offload_contexts
        context_fn = functools.partial(selective_offload_contexts, policy, manager, min_bytes)
    if use_reentrant:
        # torch's keywords, as torch's reentrant checkpoint takes them (debug is refused, the rest ignored).
        options = {name: kwargs.pop(name) for name in ("preserve_rng_state", "determinism_check", "debug", "early_stop")
                   if name in kwargs}
        if options.get("debug"):
            raise ValueError("torch_offload.selective_checkpoint: debug= is only taken with use_reentrant=False")
        output = reentrant_checkpoint(function, args, kwargs, manager, options.get("preserve_rng_state", True),
                                      scopes=context_fn)
    else:
        output = offload_checkpoint(function, *args, context_fn=context_fn, manager=manager, **kwargs)
    if store is not None:
        store.finish_saves()
    return output
