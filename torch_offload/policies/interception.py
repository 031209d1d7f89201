"""The named selective policies ("attention", "attention+qkv", "attention+fc2+out_proj", ...) without
a dispatch mode over the whole block.

Through torch's selective checkpointing (per_op.py), every op of a block, forward and recompute,
passes through two Python dispatch modes so that the policy can pick out the one op that matters:
tens of microseconds per op, which cost half of a short step's time (docs/performance.md). This path
intercepts only the calls that matter, with a torch function mode (_BlockCalls, a
torch.overrides.TorchFunctionMode) entered in the thread that runs the block, in its forward and in
its recompute: the calls of torch.nn.functional.scaled_dot_product_attention and, with projection
groups (projections.py), the calls of torch.nn.functional.linear with one of those modules' weights.
Every other torch function passes through the mode as it is. Nothing process-wide changes:
torch.nn.functional keeps torch's own functions, and other threads, or code outside the blocks,
never see the mode.

Each call that passes through the mode costs Python: about 130 per Llama decoder layer when the mode
is entered for the block's whole run, as selective_checkpoint() does by itself. Under apply() each
block has a BlockScoping: forward hooks on its attention modules (and, with an MLP projection group,
its MLP modules), found by the module presets' names (targets/presets.py), enter the mode only while
those modules run, which leaves about 75 calls per layer. A block enters the mode for its whole run
until a forward run has shown that each call it intercepts is made inside those modules; a block
without such a module, or that makes one of those calls elsewhere, keeps the whole run.

In our non-reentrant checkpoint an intercepted call runs once, in forward, and is stood in for in the
recompute (captured_calls.py): the recompute skips the attention and the projections' matrix products.
Elsewhere (the reentrant variant, torch's checkpoint), and for a linear call whose tensors are
subclasses or that autocast casts, a dispatch mode is entered for that one call only (_FusedOutputs),
which offloads the outputs of its fused kernel or matrix product into the block's OffloadStore in
forward and returns them restored in the recompute. Every other op runs at full speed, and the rest of
the block is recomputed as under plain checkpointing.

Inside a region compiled by torch.compile the mode lets every call through (dynamo traces it, and the
hooks that enter it, as if they were absent): such a region is recomputed as under plain
checkpointing.
"""
import threading
import warnings

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..checkpointing.nonreentrant import current_frame, frame_of_context
from ..targets.presets import preset_modules
from .named_policies import ATTENTION_OPS
from .captured_calls import DISPATCHED, run_captured, stand_in

# The functions a torch function mode is handed for torch.nn.functional.scaled_dot_product_attention
# and torch.nn.functional.linear: torch's own, whatever the module attributes hold.
_SDPA = torch._C._nn.scaled_dot_product_attention
_LINEAR = torch._C._nn.linear
_MATMULS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default})
_MATH = int(torch.nn.attention.SDPBackend.MATH)  # torch._fused_sdp_choice's answer without a fused kernel
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)

_scopes = threading.local()  # .stack: the scopes entered in this thread, innermost last
_warned = False


def _innermost_scope():
    stack = getattr(_scopes, "stack", None)
    return stack[-1] if stack else None


class _BlockCalls(TorchFunctionMode):
    """The calls one scope intercepts, while it is the innermost scope of the running thread: torch
    hands a mode only the calls of the thread it is entered in (the autograd engine does not carry it
    into backward: a recompute enters its own), and calls made inside __torch_function__ skip the
    mode, so an intercepted call's own work is not intercepted again. The mode of an outer scope lets
    every call through, the inner block's attention included. Every torch call made while the mode is
    entered passes through Python here: per Llama decoder layer (forward and recompute) about 130 for
    the whole run, about 75 inside its attention module alone (BlockScoping)."""

    def __init__(self, scope):
        super().__init__()
        self.scope = scope
        self.linear = bool(scope.projection_weights or scope.kept_weights)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # The pass-through is the hot path (every torch call of the block): nothing else is read.
        if (func is _SDPA or (func is _LINEAR and self.linear)) and not torch.compiler.is_compiling() \
                and _innermost_scope() is self.scope:
            if func is _SDPA:
                return _attention(self.scope, func, args, kwargs or {})
            return _linear(self.scope, func, args, kwargs or {})
        return func(*args, **kwargs) if kwargs else func(*args)


_SDPA_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = (None, None, None, None, 0.0, False, None, False)


def _attention(scope, sdpa, args, kwargs):
    scope.calls += 1
    scope.outside += not scope.inside
    if scope.frame is not None and scope.frame is current_frame():
        return _attention_through_frame(scope, sdpa, args, kwargs)
    if scope.is_recompute or torch.is_grad_enabled():
        with scope.attention_mode:
            return sdpa(*args, **kwargs)
    # The forward of the reentrant variant runs without grad: run this call as the recompute will
    # (grad enabled, query/key/value requiring grad), so that the same kernel is chosen and it
    # computes the logsumexp that backward needs.
    args = [a.detach().requires_grad_() if i < 3 else a for i, a in enumerate(args)]
    for name in ("query", "key", "value"):
        if name in kwargs:
            kwargs[name] = kwargs[name].detach().requires_grad_()
    with torch.enable_grad(), scope.attention_mode:
        out = sdpa(*args, **kwargs)
    return out.detach()


def _attention_through_frame(scope, sdpa, args, kwargs):
    """The attention call in a block of our non-reentrant checkpoint (captured_calls.py): its saves
    captured in forward, stood in for in the recompute, where it does not run. A call that would
    take the math backend (no fused kernel) runs in both, as under the policy path."""
    call = dict(zip(_SDPA_NAMES, _SDPA_DEFAULTS))
    call.update(zip(_SDPA_NAMES, args))
    call.update(kwargs)
    call_tensors = [call[name] for name in ("query", "key", "value", "attn_mask") if call[name] is not None]
    frame, store = scope.frame, scope.attention_mode.store
    if scope.is_recompute:
        out = stand_in(frame, store, call_tensors)
        return out if out is not None else sdpa(*args, **kwargs)
    fused = torch._fused_sdp_choice(call["query"], call["key"], call["value"], call["attn_mask"], call["dropout_p"],
                                    call["is_causal"], scale=call["scale"], enable_gqa=call["enable_gqa"])
    if fused == _MATH:
        store.stood_in.append(None)
        return sdpa(*args, **kwargs)
    return run_captured(frame, store, sdpa, args, kwargs, call_tensors)


def _linear(scope, linear, args, kwargs):
    """A linear call: its product offloaded (projection_weights) or kept (kept_weights) where its
    weight is one of the scope's; any other call as it is."""
    input, weight, bias = _linear_arguments(*args, **kwargs)
    if any(weight is w for w in scope.projection_weights):
        mode = scope.matmul_mode
    elif any(weight is w for w in scope.kept_weights):
        mode = scope.keep_mode
    else:
        return linear(*args, **kwargs)
    scope.outside += not scope.inside
    store = mode.store
    if scope.frame is not None and scope.frame is current_frame():
        call_tensors = [input, weight] if bias is None else [input, weight, bias]
        if scope.is_recompute:
            if store.stood_in and store.stood_in[0] is DISPATCHED:
                store.stood_in.pop(0)
            else:
                out = stand_in(scope.frame, store, call_tensors)
                return out if out is not None else linear(*args, **kwargs)
        elif _stands_in(call_tensors, input.device.type):
            out = run_captured(scope.frame, store, linear, args, kwargs, call_tensors)
            if mode is scope.keep_mode:
                store.watch(out)
            return out
        else:
            store.stood_in.append(DISPATCHED)  # the recompute takes the dispatch mode as well
    with mode:
        out = linear(*args, **kwargs)
    if mode is scope.keep_mode and not scope.is_recompute:
        store.watch(out)
    return out


def _linear_arguments(input, weight, bias=None):
    return input, weight, bias


def _stands_in(call_tensors, device_type: str) -> bool:
    """Whether the recompute can stand in for a linear call from its arguments alone: the matrix
    product saves views of its input and weight (captured_calls.py), not casts (autocast) or the
    tensors of a subclass's own implementation."""
    if any(type(t) not in _PLAIN_TYPES for t in call_tensors):
        return False
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        return all(t.dtype == dtype for t in call_tensors[:2])
    return True


class _FusedOutputs(TorchDispatchMode):
    """Entered around one intercepted call: in forward the outputs of `ops` go to `store`
    (store.OffloadStore or KeptStore); in the recompute they come back from it and the op does not run.
    Any other op passes through. No policy call, no SAC bookkeeping: this runs once per intercepted
    call, so it is kept to a set lookup (per_op._OffloadMode is the general, per-op one)."""

    def __init__(self, ops: frozenset, store, is_recompute: bool):
        super().__init__()
        self.ops, self.store, self.is_recompute = ops, store, is_recompute

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in self.ops:
            return func(*args, **(kwargs or {}))
        if self.is_recompute:
            return self.store.restore(func)
        out = func(*args, **(kwargs or {}))
        self.store.save(func, out)
        return out


class _Scope:
    """The forward or the recompute run of one checkpointed block: entered in the thread that runs it,
    it intercepts that thread's calls until it exits: all of them, or with a checked BlockScoping only
    those made inside the block's scoped modules."""

    def __init__(self, offloaded, is_recompute: bool, projection_weights: tuple, kept=None, kept_weights: tuple = (),
                 scoping=None):
        self.attention_mode = _FusedOutputs(ATTENTION_OPS, offloaded, is_recompute)
        self.matmul_mode = _FusedOutputs(_MATMULS, offloaded, is_recompute) if projection_weights else None
        self.keep_mode = _FusedOutputs(_MATMULS, kept, is_recompute) if kept_weights else None
        self.projection_weights, self.kept_weights = projection_weights, kept_weights
        self.is_recompute = is_recompute
        self.scoping = scoping
        self.per_module = False  # the mode is entered by the scoped modules, not for the whole run
        self.inside = []  # the scoped modules running now in this run, innermost last
        self.calls = 0  # attention calls intercepted
        self.outside = 0  # calls intercepted outside the scoped modules
        self.frame = None
        self.block_calls = None

    def __enter__(self):
        if not hasattr(_scopes, "stack"):
            _scopes.stack = []
        self.frame = frame_of_context()  # our non-reentrant checkpoint's, or None
        self.block_calls = _BlockCalls(self)
        self.per_module = self.scoping is not None and self.scoping.state is _SCOPED
        if not self.per_module:
            self.block_calls.__enter__()
        _scopes.stack.append(self)
        return self

    def __exit__(self, exc_type, *exc):
        _scopes.stack.pop()
        # Per module, the mode is still entered only where an error skipped a module's forward hook.
        if not self.per_module or self.inside:
            self.block_calls.__exit__(exc_type, *exc)
        # The frame holds the recompute, which holds this scope, and the mode holds the scope: no cycle.
        self.frame = self.block_calls = None
        self.inside = []
        if exc_type is None and not self.is_recompute:
            if self.calls == 0:
                _warn_not_intercepted()
            elif self.scoping is not None:
                self.scoping.checked(self.outside)
        return False


_UNCHECKED, _SCOPED, _WHOLE = "unchecked", "scoped", "whole"


class BlockScoping:
    """Where the mode of one block's runs is entered. A block's runs enter it for the whole run until a
    forward run has intercepted its calls, each inside one of the block's scoped modules (its attention
    modules and, with MLP projection groups, its MLP modules: module presets, targets/presets.py); from
    then on its runs enter it only while one of those modules runs (their forward pre- and post-hooks),
    so that the rest of the block's calls, its norms, MLP and residuals, skip Python. A block where an
    intercepted call ran outside them stays with the whole run. The hooks act only for a run of this
    block that is the innermost scope of the running thread: other threads, and code outside the
    block's runs, see nothing but two hook calls per module call."""

    def __init__(self):
        self.state = _UNCHECKED

    def checked(self, outside: int) -> None:
        """After a forward run that intercepted calls, `outside` of them outside the scoped modules."""
        if outside:
            self.state = _WHOLE
        elif self.state is _UNCHECKED:
            self.state = _SCOPED

    def _run_here(self):
        """The innermost scope of this thread where it is a run of this block (not while compiling)."""
        if torch.compiler.is_compiling():
            return None
        scope = _innermost_scope()
        return scope if scope is not None and scope.scoping is self else None

    def enter(self, module, args):
        scope = self._run_here()
        if scope is not None:
            if scope.per_module and not scope.inside:
                scope.block_calls.__enter__()
            scope.inside.append(module)

    def exit(self, module, args, output):
        scope = self._run_here()
        if scope is not None and scope.inside and scope.inside[-1] is module:
            scope.inside.pop()
            if scope.per_module and not scope.inside:
                scope.block_calls.__exit__(None, None, None)


def scoped_modules(block, groups=()) -> list:
    """The modules of `block` inside which its intercepted calls are expected: its attention modules
    and, with an MLP projection group ("fc1", "fc2", kept or not), its MLP modules; [] where it has
    no attention module by the presets' names."""
    modules = []
    for preset in ("attn", "mlp") if any(g.endswith(("fc1", "fc2")) for g in groups) else ("attn",):
        try:
            names = preset_modules(block, preset).include
        except ValueError:  # selects nothing
            names = []
        if preset == "attn" and not names:
            return []
        modules.extend(block.get_submodule(name) for name in names)
    return modules


def scope_block(block, groups=()):
    """(the BlockScoping of `block`'s runs, the handles of the hooks it put on the block's scoped
    modules, for remove()), or (None, ()) where the block has no attention module the presets find:
    its runs enter the mode for the whole run."""
    modules = scoped_modules(block, groups)
    if not modules:
        return None, ()
    scoping = BlockScoping()
    hooks = []
    for module in modules:
        hooks.append(module.register_forward_pre_hook(scoping.enter))
        # always_call: an error in the module's forward exits the mode too
        hooks.append(module.register_forward_hook(scoping.exit, always_call=True))
    return scoping, tuple(hooks)


def _warn_not_intercepted():
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "torch_offload selective policy='attention': a checkpointed block made no call to "
            "torch.nn.functional.scaled_dot_product_attention, so nothing in it was offloaded and its "
            "attention is recomputed. If the model computes attention with another op, or inside a "
            "torch.compile'd region, pass policy=torch_offload.policies.attention (the function): it finds "
            "the fused attention ops per op, at a higher cost per op", stacklevel=3)


def attention_offload_contexts(offloaded, projection_weights: tuple = (), kept=None, kept_weights: tuple = (),
                               scoping=None):
    """context_fn for torch_offload.checkpoint: the forward and the recompute scope of one block,
    sharing `offloaded` (store.OffloadStore: the handles of the outputs, in call order); calls of
    torch.nn.functional.linear with one of `projection_weights` have their products offloaded too,
    those with one of `kept_weights` have theirs held in `kept` (store.KeptStore) on the device.
    scoping: the block's BlockScoping (scope_block), or None: the mode is entered for the whole run."""
    return (_Scope(offloaded, False, projection_weights, kept, kept_weights, scoping),
            _Scope(offloaded, True, projection_weights, kept, kept_weights, scoping))
