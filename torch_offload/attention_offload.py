"""The named selective policies "attention" and "attention_qkv" without a dispatch mode over the
whole block.

Through torch's selective checkpointing, every op of a block (forward and recompute) passes through
two Python dispatch modes so that the policy can pick out the one op that matters: tens of
microseconds per op, which cost 50% of the step at 4k tokens on the reference model. This path
intercepts only that op's caller: while a block checkpointed by us runs, the module attribute
torch.nn.functional.scaled_dot_product_attention is a wrapper, and inside that one call the same
offload mode as the policy path (selective._OffloadMode) offloads the fused kernel's outputs in
forward and returns them restored in the recompute. Every other op runs at full speed, and the rest
of the block is recomputed as under plain checkpointing. "attention_qkv" also offloads the outputs of
the block's query/key/value projections (module_presets' "qkv" modules): torch.nn.functional.linear
is wrapped the same way, and only calls with one of those modules' weights are intercepted, so the
recompute skips their matrix products too (their backward still gets its recomputed input).

Each wrapper is installed while at least one block that needs it runs (in any thread; the linear
one only for "attention_qkv") and removed after, so code outside our blocks, compiled or not, sees
torch's own functions. Models that call SDPA through a
name imported before the block ran (`from torch.nn.functional import scaled_dot_product_attention`)
are not intercepted: their attention is recomputed, and a warning says to pass the policy as a
function (policy=torch_offload.policies.attention), which takes the per-op path.
"""
import threading
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

from . import policies
from .module_presets import preset_modules

FAST_POLICIES = ("attention", "attention_qkv")
# Saves per block: "attention" policies.SAVES_PER_BLOCK (input, attention output, logsumexp), and q, k, v.
SAVES_PER_BLOCK = {"attention": policies.SAVES_PER_BLOCK, "attention_qkv": policies.SAVES_PER_BLOCK + 3}
_MATMULS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default})

_scopes = threading.local()  # .stack: the scopes entered in this thread, innermost last
_warned = False
_projections = weakref.WeakKeyDictionary()  # block -> its q/k/v projection Linear modules


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
_LINEAR = _Patch("linear")  # only while a scope has projections: every linear call pays for it


def _offloading_sdpa(*args, **kwargs):
    stack = getattr(_scopes, "stack", None)
    if not stack:  # another thread, or outside our blocks: torch's function as is
        return _SDPA.torch_fn(*args, **kwargs)
    scope = stack[-1]
    scope.calls += 1
    with scope.attention_mode:
        return _SDPA.torch_fn(*args, **kwargs)


def _offloading_linear(input, weight, bias=None):
    stack = getattr(_scopes, "stack", None)
    if stack and any(weight is w for w in stack[-1].projection_weights):
        with stack[-1].matmul_mode:
            return _LINEAR.torch_fn(input, weight, bias)
    return _LINEAR.torch_fn(input, weight, bias)


_SDPA.wrapper, _LINEAR.wrapper = _offloading_sdpa, _offloading_linear


def _offload_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_CPU_OFFLOAD if op in _MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def projection_weights(block: nn.Module) -> tuple:
    """The weights of the Linear modules in `block`'s query/key/value projections, read now (FSDP2
    swaps a module's parameters between sharded and unsharded ones)."""
    modules = _projections.get(block)
    if modules is None:
        try:
            names = preset_modules(block, "qkv").include
        except ValueError:  # selects nothing
            names = []
        modules = tuple(m for name in names for m in block.get_submodule(name).modules() if isinstance(m, nn.Linear))
        if not modules:
            raise ValueError(f"torch_offload selective policy='attention_qkv': {type(block).__name__} has no "
                             "query/key/value projections (q_proj, k_proj, v_proj, qkv_proj, ... inside an "
                             "attention module); use policy='attention'")
        _projections[block] = modules
    return tuple(m.weight for m in modules)


class _Scope:
    """The forward or the recompute run of one checkpointed block."""

    def __init__(self, offloaded, is_recompute: bool, projection_weights: tuple):
        from .selective import _OffloadMode  # selective imports this module

        self.attention_mode = _OffloadMode(policies.attention, offloaded, is_recompute)
        self.matmul_mode = _OffloadMode(_offload_matmuls, offloaded, is_recompute)
        self.projection_weights = projection_weights
        self.is_recompute = is_recompute
        self.calls = 0

    def __enter__(self):
        if not hasattr(_scopes, "stack"):
            _scopes.stack = []
        _scopes.stack.append(self)
        _SDPA.install()
        if self.projection_weights:
            _LINEAR.install()
        return self

    def __exit__(self, exc_type, *exc):
        if self.projection_weights:
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


def attention_offload_contexts(offloaded, projection_weights: tuple = ()):
    """context_fn for torch_offload.checkpoint: the forward and the recompute scope of one block,
    sharing `offloaded` (selective._Offloaded: the handles of the outputs, in call order); calls of
    torch.nn.functional.linear with one of `projection_weights` have their products offloaded too."""
    return (_Scope(offloaded, False, projection_weights), _Scope(offloaded, True, projection_weights))
