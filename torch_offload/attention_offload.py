"""The named selective policies ("attention", "attention+qkv", "attention+fc2+out_proj", ...) without
a dispatch mode over the whole block.

Through torch's selective checkpointing, every op of a block (forward and recompute) passes through
two Python dispatch modes so that the policy can pick out the one op that matters: tens of
microseconds per op, which cost 50% of the step at 4k tokens on the reference model. This path
intercepts only that op's caller: while a block checkpointed by us runs, the module attribute
torch.nn.functional.scaled_dot_product_attention is a wrapper, and inside that one call the same
offload store as the policy path (selective._Offloaded) takes the fused kernel's outputs in forward
(a dispatch mode entered for that call only, _FusedOutputs) and returns them restored in the
recompute. Every other op runs at full speed, and the rest
of the block is recomputed as under plain checkpointing.

"attention+<group>+...": the products of the block's Linear modules in those module presets are
offloaded too (PROJECTION_GROUPS: "qkv" the query/key/value projections, "out_proj" the attention's
output projection, "fc1" the MLP's up/gate projections, "fc2" its down projection; "attention_qkv"
is "attention+qkv"). torch.nn.functional.linear is wrapped the same way and only calls with one of
those modules' weights are intercepted, so the recompute skips their matrix products (their
backward still gets its recomputed input). The products worth moving are those whose recompute
costs most per byte: a Linear's costs 2 x in_features FLOPs per output element, so the MLP's down
projection (in_features = the MLP width) pays most after the attention itself.
"keep_<group>" (e.g. "attention+qkv+keep_fc1") keeps that group's products on the device instead:
no copy and no recompute, for memory. The MLP's up/gate products are too large for the link to
carry in the time their recompute takes, but where the memory budget leaves room (the last blocks
of a large model, whose backward comes before most gradients exist) keeping them spares that
recompute at a third of the memory of not checkpointing the block at all (mode="auto" plans it).

Each wrapper is installed while at least one block that needs it runs (in any thread; the linear
one only with projection groups) and removed after, so code outside our blocks, compiled or not,
sees torch's own functions. Models that call SDPA through a name imported before the block ran
(`from torch.nn.functional import scaled_dot_product_attention`) are not intercepted: their
attention is recomputed, and a warning says to pass the policy as a function
(policy=torch_offload.policies.attention), which takes the per-op path.
"""
import functools
import threading
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from . import policies
from .module_presets import PRESETS, preset_modules
from .nonreentrant import current_frame, frame_of_context
from .stand_in import run_captured, stand_in

# A named policy is "attention" plus, joined by "+", groups of projections (module_presets' names)
# whose products are offloaded too: "attention+fc2+out_proj". "attention_qkv" is "attention+qkv".
PROJECTION_GROUPS = ("qkv", "out_proj", "fc1", "fc2")
KEEP = "keep_"  # "keep_fc1": the group's products stay on the device (not offloaded, not recomputed)
_ALIASES = {"attention_qkv": "attention+qkv"}
_MATMULS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default})
_MATH = int(torch.nn.attention.SDPBackend.MATH)  # torch._fused_sdp_choice's answer without a fused kernel

_scopes = threading.local()  # .stack: the scopes entered in this thread, innermost last
_warned = False
_projections = weakref.WeakKeyDictionary()  # block -> {group: its Linear modules}


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
    (selective._Offloaded or _Kept); in the recompute they come back from it and the op does not run.
    Any other op passes through. No policy call, no SAC bookkeeping: this runs once per intercepted
    call, so it is kept to a set lookup (selective._OffloadMode is the general, per-op one)."""

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


def projection_groups(policy):
    """The projection groups of a named policy ("attention": none; "attention+fc2+out_proj": fc2,
    out_proj), or None when `policy` is not such a name. Raises ValueError for an unknown group."""
    if not isinstance(policy, str):
        return None
    return _parse_named(policy)


@functools.lru_cache(maxsize=256)  # asked on every checkpointed call: parse each name once
def _parse_named(policy: str):
    head, *groups = _ALIASES.get(policy, policy).split("+")
    if head != "attention" or (policy != "attention" and not groups):
        return None
    bases = [_base_group(g) for g in groups]
    unknown = [g for g in bases if g not in PROJECTION_GROUPS]
    if unknown or len(set(bases)) != len(bases):
        raise ValueError(f"torch_offload selective policy={policy!r}: after 'attention', join with '+' distinct "
                         f"projection groups among {PROJECTION_GROUPS}, each offloaded or, prefixed {KEEP!r}, kept "
                         "on the device (e.g. 'attention+fc2+out_proj', 'attention+qkv+keep_fc1')")
    return tuple(groups)


def _base_group(group: str) -> str:
    """The module preset a group names: "keep_fc1" -> "fc1"."""
    return group[len(KEEP):] if group.startswith(KEEP) else group


def split_kept(groups) -> tuple:
    """(offloaded groups, kept groups without their prefix) of projection_groups' answer."""
    groups = groups or ()
    return (tuple(g for g in groups if not g.startswith(KEEP)),
            tuple(_base_group(g) for g in groups if g.startswith(KEEP)))


def is_fast_policy(policy) -> bool:
    return projection_groups(policy) is not None


def projection_weights(block: nn.Module, groups=("qkv",)) -> tuple:
    """The weights of the Linear modules of `groups` (module presets) in `block`, read now (FSDP2
    swaps a module's parameters between sharded and unsharded ones)."""
    found = _projections.setdefault(block, {})
    weights = []
    for group in map(_base_group, groups):
        modules = found.get(group)
        if modules is None:
            try:
                names = preset_modules(block, group).include
            except ValueError:  # selects nothing
                names = []
            modules = tuple(m for name in names for m in block.get_submodule(name).modules() if isinstance(m, nn.Linear))
            if not modules:
                raise ValueError(f"torch_offload selective policy with {group!r}: {type(block).__name__} has no "
                                 f"Linear modules in module preset {group!r} ({PRESETS[group][0]}); "
                                 "leave the group out of the policy (or use policy='attention')")
            found[group] = modules
        weights.extend(m.weight for m in modules)
    return tuple(weights)


def saves_per_block(policy, block: nn.Module) -> int:
    """Tensors one block saves under a named policy: the prefetch depth that keeps backward from
    waiting on each copy."""
    groups = projection_groups(policy)
    projection_weights(block, groups)  # raises for a group the block lacks, kept ones too
    return policies.SAVES_PER_BLOCK + len(projection_weights(block, split_kept(groups)[0]))


class _Scope:
    """The forward or the recompute run of one checkpointed block."""

    def __init__(self, offloaded, is_recompute: bool, projection_weights: tuple, kept=None, kept_weights: tuple = ()):
        self.attention_mode = _FusedOutputs(policies.ATTENTION_OPS, offloaded, is_recompute)
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
    sharing `offloaded` (selective._Offloaded: the handles of the outputs, in call order); calls of
    torch.nn.functional.linear with one of `projection_weights` have their products offloaded too,
    those with one of `kept_weights` have theirs held in `kept` (selective._Kept) on the device."""
    return (_Scope(offloaded, False, projection_weights, kept, kept_weights),
            _Scope(offloaded, True, projection_weights, kept, kept_weights))
