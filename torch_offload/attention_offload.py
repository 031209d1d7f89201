"""The "attention" selective policy without a dispatch mode over the whole block.

Through torch's selective checkpointing, every op of a block (forward and recompute) passes through
two Python dispatch modes so that the policy can pick out the one op that matters: tens of
microseconds per op, which cost 50% of the step at 4k tokens on the reference model. This path
intercepts only that op's caller: while a block checkpointed by us runs, the module attribute
torch.nn.functional.scaled_dot_product_attention is a wrapper, and inside that one call the same
offload mode as the policy path (selective._OffloadMode) offloads the fused kernel's outputs in
forward and returns them restored in the recompute. Every other op runs at full speed, and the rest
of the block is recomputed as under plain checkpointing.

The wrapper is installed while at least one such block runs (in any thread) and removed after, so
code outside our blocks, compiled or not, sees torch's own function. Models that call SDPA through a
name imported before the block ran (`from torch.nn.functional import scaled_dot_product_attention`)
are not intercepted: their attention is recomputed, and a warning says to pass the policy as a
function (policy=torch_offload.policies.attention), which takes the per-op path.
"""
import threading
import warnings

import torch.nn.functional as F

from . import policies

_scopes = threading.local()  # .stack: the scopes entered in this thread, innermost last
_install_lock = threading.Lock()
_install_count = 0
_torch_sdpa = None  # the function the attribute held when we installed ours, restored after
_warned = False


def _offloading_sdpa(*args, **kwargs):
    stack = getattr(_scopes, "stack", None)
    if not stack:  # another thread, or outside our blocks: torch's function as is
        return _torch_sdpa(*args, **kwargs)
    scope = stack[-1]
    scope.calls += 1
    with scope.mode:
        return _torch_sdpa(*args, **kwargs)


def _install():
    global _install_count, _torch_sdpa
    with _install_lock:
        if _install_count == 0:
            _torch_sdpa = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = _offloading_sdpa
        _install_count += 1


def _uninstall():
    global _install_count
    with _install_lock:
        _install_count -= 1
        if _install_count == 0:
            F.scaled_dot_product_attention = _torch_sdpa


class _Scope:
    """The forward or the recompute run of one checkpointed block."""

    def __init__(self, offloaded, is_recompute: bool):
        from .selective import _OffloadMode  # selective imports this module

        self.mode = _OffloadMode(policies.attention, offloaded, is_recompute)
        self.is_recompute = is_recompute
        self.calls = 0

    def __enter__(self):
        if not hasattr(_scopes, "stack"):
            _scopes.stack = []
        _scopes.stack.append(self)
        _install()
        return self

    def __exit__(self, exc_type, *exc):
        _uninstall()
        _scopes.stack.pop()
        if exc_type is None and not self.is_recompute and self.calls == 0:
            _warn_not_intercepted()
        return False


def _warn_not_intercepted():
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "torch_offload selective policy='attention': a checkpointed block made no call to "
            "torch.nn.functional.scaled_dot_product_attention, so nothing in it was offloaded and its "
            "attention is recomputed. If the model calls SDPA through a name imported earlier, or another "
            "attention op, pass policy=torch_offload.policies.attention (the function): it finds the fused "
            "attention ops per op, at a higher cost per op", stacklevel=3)


def attention_offload_contexts(offloaded):
    """context_fn for torch_offload.checkpoint: the forward and the recompute scope of one block,
    sharing `offloaded` (selective._Offloaded: the handles of the outputs, in call order)."""
    return _Scope(offloaded, is_recompute=False), _Scope(offloaded, is_recompute=True)
