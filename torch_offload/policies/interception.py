"""The named selective policies ("attention", "attention+qkv", "attention+fc2+out_proj", ...) without
a dispatch mode over the whole block.

Through torch's selective checkpointing (per_op.py), every op of a block, forward and recompute,
passes through two Python dispatch modes so that the policy can pick out the one op that matters:
tens of microseconds per op, which cost half of a short step's time (docs/performance.md). This path
intercepts only that op's caller: while a block checkpointed by us runs, the module attribute
torch.nn.functional.scaled_dot_product_attention is a wrapper. In our non-reentrant checkpoint the
attention call then runs once, in forward, and is stood in for in the recompute (stand_in.py);
elsewhere (the reentrant variant, torch's checkpoint) a dispatch mode is entered for that one call
only (_FusedOutputs), which offloads the fused kernel's outputs into the block's OffloadStore in
forward and returns them restored in the recompute. Every other op runs at full speed, and the rest
of the block is recomputed as under plain checkpointing. With projection groups (projections.py)
torch.nn.functional.linear is wrapped the same way and only calls with one of those modules'
weights are intercepted, so the recompute skips their matrix products (their backward still gets
its recomputed input).

Each wrapper is installed while at least one block that needs it runs (in any thread; the linear
one only with projection groups) and removed after, so code outside our blocks, compiled or not,
sees torch's own functions. Models that call SDPA through a name imported before the block ran
(`from torch.nn.functional import scaled_dot_product_attention`) are not intercepted: their
attention is recomputed, and a warning says to pass the policy as a function
(policy=torch_offload.policies.attention), which takes the per-op path.
"""
import threading
import warnings

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ..checkpointing.nonreentrant import current_frame, frame_of_context
from .named import ATTENTION_OPS
from .stand_in import run_captured, stand_in

_MATMULS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default})
_MATH = int(torch.nn.attention.SDPBackend.MATH)  # torch._fused_sdp_choice's answer without a fused kernel

_scopes = threading.local()  # .stack: the scopes entered in this thread, innermost last
_warned = False


class _Patch:
    """One attribute of torch.nn.functional, replaced by our wrapper while at least one scope (in any
    thread) needs it; `torch_fn` is what the attribute held before, put back after."""

    _lock = threading.Lock()

    def __init__(self, name: str):
        self.name = name
        self.count = 0
        self.torch_fn = None
        self.wrapper = None

    def install(self) -> None:
        with self._lock:
            if self.count == 0:
                self.torch_fn = getattr(F, self.name)
                setattr(F, self.name, self.wrapper)
            self.count += 1

    def uninstall(self) -> None:
        with self._lock:
            self.count -= 1
            if self.count == 0:
                setattr(F, self.name, self.torch_fn)


_SDPA = _Patch("scaled_dot_product_attention")
_LINEAR = _Patch("linear")  # only while a scope has projection groups: every linear call pays for it


def _offloading_sdpa(*args, **kwargs):
    stack = getattr(_scopes, "stack", None)
    if not stack:  # another thread, or outside our blocks: torch's function as is
        return _SDPA.torch_fn(*args, **kwargs)
    scope = stack[-1]
    scope.calls += 1
    if scope.frame is not None and scope.frame is current_frame():
        return _sdpa_through_frame(scope, args, kwargs)
    if scope.is_recompute or torch.is_grad_enabled():
        with scope.attention_mode:
            return _SDPA.torch_fn(*args, **kwargs)
    # The forward of the reentrant variant runs without grad: run this call as the recompute will
    # (grad enabled, query/key/value requiring grad), so that the same kernel is chosen and it
    # computes the logsumexp that backward needs.
    args = [a.detach().requires_grad_() if i < 3 else a for i, a in enumerate(args)]
    for name in ("query", "key", "value"):
        if name in kwargs:
            kwargs[name] = kwargs[name].detach().requires_grad_()
    with torch.enable_grad(), scope.attention_mode:
        out = _SDPA.torch_fn(*args, **kwargs)
    return out.detach()


_SDPA_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = (None, None, None, None, 0.0, False, None, False)


def _sdpa_through_frame(scope, args, kwargs):
    """The attention call in a block of our non-reentrant checkpoint (stand_in.py): its saves
    captured in forward, stood in for in the recompute, where it does not run. A call that would
    take the math backend (no fused kernel) runs in both, as under the policy path."""
    call = dict(zip(_SDPA_NAMES, _SDPA_DEFAULTS))
    call.update(zip(_SDPA_NAMES, args))
    call.update(kwargs)
    call_tensors = [call[name] for name in ("query", "key", "value", "attn_mask") if call[name] is not None]
    frame, store = scope.frame, scope.attention_mode.store
    if scope.is_recompute:
        out = stand_in(frame, store, call_tensors)
        return out if out is not None else _SDPA.torch_fn(*args, **kwargs)
    fused = torch._fused_sdp_choice(call["query"], call["key"], call["value"], call["attn_mask"], call["dropout_p"],
                                    call["is_causal"], scale=call["scale"], enable_gqa=call["enable_gqa"])
    if fused == _MATH:
        store.stood_in.append(None)
        return _SDPA.torch_fn(*args, **kwargs)
    return run_captured(frame, store, _SDPA.torch_fn, args, kwargs, call_tensors)


def _offloading_linear(input, weight, bias=None):
    stack = getattr(_scopes, "stack", None)
    if stack:
        scope = stack[-1]
        if any(weight is w for w in scope.projection_weights):
            with scope.matmul_mode:
                return _LINEAR.torch_fn(input, weight, bias)
        if any(weight is w for w in scope.kept_weights):
            with scope.keep_mode:
                out = _LINEAR.torch_fn(input, weight, bias)
            if not scope.is_recompute:
                scope.keep_mode.store.watch(out)
            return out
    return _LINEAR.torch_fn(input, weight, bias)


_SDPA.wrapper, _LINEAR.wrapper = _offloading_sdpa, _offloading_linear


class _FusedOutputs(TorchDispatchMode):
    """Entered around one intercepted call: in forward the outputs of `ops` go to `store`
    (store.OffloadStore or KeptStore); in the recompute they come back from it and the op does not run.
    Any other op passes through. No policy call, no SAC bookkeeping: this runs once per intercepted
    call, so it is kept to a set lookup (per_op._OffloadMode is the general, per-op one)."""

    def __init__(self, ops: frozenset, store, is_recompute: bool):
        super().__init__()
        self.ops, self.store, self.is_recompute = ops, store, is_recompute

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo, which costs more per call
        # than the rest of ours (a few ops per intercepted call, forward and recompute). This mode is
        # eager only (compiled models go through torch_offload.compile), so no compiled frame needs it.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in self.ops:
            return func(*args, **(kwargs or {}))
        if self.is_recompute:
            return self.store.restore(func)
        out = func(*args, **(kwargs or {}))
        self.store.save(func, out)
        return out


class _Scope:
    """The forward or the recompute run of one checkpointed block."""

    def __init__(self, offloaded, is_recompute: bool, projection_weights: tuple, kept=None, kept_weights: tuple = ()):
        self.attention_mode = _FusedOutputs(ATTENTION_OPS, offloaded, is_recompute)
        self.matmul_mode = _FusedOutputs(_MATMULS, offloaded, is_recompute) if projection_weights else None
        self.keep_mode = _FusedOutputs(_MATMULS, kept, is_recompute) if kept_weights else None
        self.projection_weights, self.kept_weights = projection_weights, kept_weights
        self.is_recompute = is_recompute
        self.calls = 0
        self.frame = None

    def __enter__(self):
        if not hasattr(_scopes, "stack"):
            _scopes.stack = []
        _scopes.stack.append(self)
        self.frame = frame_of_context()  # our non-reentrant checkpoint's, or None
        _SDPA.install()
        if self.projection_weights or self.kept_weights:
            _LINEAR.install()
        return self

    def __exit__(self, exc_type, *exc):
        self.frame = None  # the frame holds the recompute, which holds this scope: no cycle
        if self.projection_weights or self.kept_weights:
            _LINEAR.uninstall()
        _SDPA.uninstall()
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


def attention_offload_contexts(offloaded, projection_weights: tuple = (), kept=None, kept_weights: tuple = ()):
    """context_fn for torch_offload.checkpoint: the forward and the recompute scope of one block,
    sharing `offloaded` (store.OffloadStore: the handles of the outputs, in call order); calls of
    torch.nn.functional.linear with one of `projection_weights` have their products offloaded too,
    those with one of `kept_weights` have theirs held in `kept` (store.KeptStore) on the device."""
    return (_Scope(offloaded, False, projection_weights, kept, kept_weights),
            _Scope(offloaded, True, projection_weights, kept, kept_weights))
