"""Selective offload with any policy function: per op, through dispatch modes.

Inside a checkpointed block a policy decides, per op output, whether it is kept on the device
(CheckpointPolicy.MUST_SAVE / PREFER_SAVE), recomputed in backward (MUST_RECOMPUTE /
PREFER_RECOMPUTE) or offloaded through our engine (MUST_CPU_OFFLOAD / PREFER_CPU_OFFLOAD):
offload_save in forward, offload_restore in the recompute, so the pinned pool, the in-flight bound
and backward prefetch apply. torch's selective checkpointing (create_selective_checkpoint_contexts)
keeps and recomputes as usual; one more dispatch mode above it serves the offload decisions. In
forward it runs the op and offloads its outputs; in the recompute it returns the restored outputs
without running the op. For every other op it hands the policy's decision down to torch's mode, so
the user's policy is asked once per op. Every op of the block passes through Python here, which costs
tens of microseconds per op: the named policies take the path of interception.py instead. Eager only
(torch.compile: torch_offload.compile).
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (SAC_IGNORED_OPS, CheckpointPolicy, SelectiveCheckpointContext,
                                    create_selective_checkpoint_contexts)

from .._library.manager import default_manager
from .named_policies import resolve
from ..config.defaults import SELECTIVE_MIN_BYTES
from .store import OffloadStore

_OFFLOAD = (CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD)


class _OffloadMode(TorchDispatchMode):
    """Above torch's selective checkpointing modes: serves the policy's offload decisions."""

    def __init__(self, policy, offloaded: OffloadStore, is_recompute: bool):
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


def selective_offload_contexts(policy="attention", manager=None, min_bytes=SELECTIVE_MIN_BYTES,
                               allow_cache_entry_mutation=False):
    """Like torch.utils.checkpoint.create_selective_checkpoint_contexts, for `context_fn=` of
    torch_offload.checkpoint (or torch's checkpoint): returns the forward and recompute contexts.

    policy: a name from torch_offload.policies.POLICIES ("attention", "attention_save"), a list of
    ops to keep (torch's meaning), or a function with torch's policy signature returning a
    CheckpointPolicy (MUST/PREFER_CPU_OFFLOAD: offloaded through `manager`) or a bool.
    min_bytes: tensors below it are kept on the device even when the policy offloads their op.
    """
    policy_fn = resolve(policy, "torch_offload.selective_offload_contexts")
    offloaded = OffloadStore(manager if manager is not None else default_manager(), min_bytes)
    keep_forward, keep_recompute = create_selective_checkpoint_contexts(
        offloaded.take_decision, allow_cache_entry_mutation=allow_cache_entry_mutation)
    return (_Modes(keep_forward, _OffloadMode(policy_fn, offloaded, is_recompute=False)),
            _Modes(keep_recompute, _OffloadMode(policy_fn, offloaded, is_recompute=True)))
