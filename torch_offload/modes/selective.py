"""mode="selective": each block is checkpointed with a selective offload policy: its input goes to
host memory as in "hidden_states", the op outputs the policy offloads (default "attention": the fused
attention outputs and their logsumexp) are offloaded instead of recomputed, and the rest of the block
is recomputed in backward. selective_checkpoint() is the same for one call.

The named policies ("attention", "attention+qkv+out_proj", ...) intercept only the calls that matter
(policies/interception.py); a policy function takes the per-op path (policies/per_op.py).
"""
import functools

import torch
from torch import nn

from .._library.manager import OffloadManager, default_manager, register_stats_source
from ..blocks import ForwardWrapper
from ..checkpointing.checkpoint import checkpoint
from ..checkpointing.reentrant import reentrant_checkpoint
from ..hooks.link_budget import PolicyLinkBudget
from ..policies.interception import attention_offload_contexts, scope_block
from ..policies.named_policies import SAVES_PER_BLOCK
from ..policies.per_op import selective_offload_contexts
from ..policies.projections import is_fast_policy, projection_groups, projection_weights, saves_per_block, split_kept
from ..config.defaults import SELECTIVE_MIN_BYTES
from ..policies.store import KeptBytes, KeptStore, OffloadStore
from .installer import CheckpointInstaller

_TORCH_KEYWORDS = ("preserve_rng_state", "determinism_check", "debug", "early_stop")


def selective_checkpoint(function, *args, policy="attention", manager=None, min_bytes=SELECTIVE_MIN_BYTES,
                         block=None, use_reentrant=False, kept_bytes=None, scoping=None, **kwargs):
    """torch_offload.checkpoint (the first tensor input offloaded, the block recomputed in backward)
    with a selective offload policy inside the block; other keywords as in torch_offload.checkpoint.

    The named policies "attention" and "attention+<group>+..." ("attention_qkv" is "attention+qkv")
    intercept only the calls that matter; projection groups need the block's module, to find its
    projections: `function` itself when it is an nn.Module, else `block=`. A policy function takes
    the per-op path (dispatch modes). min_bytes: smaller outputs stay on the device.
    use_reentrant=True: the reentrant variant (cheaper on the host, gradients through .backward()
    only), for the named policies. kept_bytes: a KeptBytes that counts the products "keep_<group>"
    groups keep on the device (mode "auto" reads it). scoping: the block's
    policies.interception.BlockScoping (apply() makes one per block), for the calls of the block's
    attention modules to be intercepted without the rest of its calls passing through Python."""
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
        store = OffloadStore(manager, min_bytes, finish_at_end=True)
        context_fn = functools.partial(attention_offload_contexts, store, weights,
                                       KeptStore(manager, kept_bytes) if kept_weights else None, kept_weights,
                                       scoping)
    else:
        store = None  # made per call by selective_offload_contexts
        context_fn = functools.partial(selective_offload_contexts, policy, manager, min_bytes)
    if use_reentrant:
        # torch's keywords, as torch's reentrant checkpoint takes them (debug is refused, the rest ignored).
        options = {name: kwargs.pop(name) for name in _TORCH_KEYWORDS if name in kwargs}
        if options.get("debug"):
            raise ValueError("torch_offload.selective_checkpoint: debug= is only taken with use_reentrant=False")
        output = reentrant_checkpoint(function, args, kwargs, manager, options.get("preserve_rng_state", True),
                                      scopes=context_fn)
    else:
        output = checkpoint(function, *args, context_fn=context_fn, manager=manager, **kwargs)
    if store is not None:
        store.finish_saves()
    return output


class FirstForwardDepth:
    """selective_checkpoint for one block, that raises the manager's prefetch depth to the saves the
    block made in its first training forward, where they are more than the depth chosen from the
    policy: restoring a block's first save in backward then prefetches all of the previous block's.
    The policy alone cannot tell how many attention calls a block makes: a video DiT block's self-
    and cross-attention save five tensors under "attention", not three. Data, not a closure, so that
    a deep copy counts for its own manager (copy_and_pickle.py)."""

    __name__ = selective_checkpoint.__name__  # CheckpointFunction's repr names it

    def __init__(self, manager):
        self.manager, self.pending = manager, True

    def __call__(self, *args, **kwargs):
        if not self.pending or torch.compiler.is_compiling():
            return selective_checkpoint(*args, **kwargs)
        before = self.manager.stats()["saves"]
        output = selective_checkpoint(*args, **kwargs)
        saves = int(self.manager.stats()["saves"] - before)
        self.pending = False
        if saves > self.manager.prefetch_depth():
            self.manager.set_prefetch_depth(saves)
        return output


def block_checkpoint(manager, fit_prefetch_depth: bool):
    """The checkpoint function of one block: selective_checkpoint, counting the block's saves in its
    first training forward where the mode chose the manager's depth."""
    return FirstForwardDepth(manager) if fit_prefetch_depth else selective_checkpoint


def _first_tensor_bytes(args, kwargs) -> int:
    """The bytes of a call's first tensor argument (the block input checkpoint() offloads)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
    return 0


class SelectiveForward(ForwardWrapper):
    """A block's forward under selective_checkpoint while training with grad enabled. With a link
    budget (`link`, hooks/link_budget.PolicyLinkBudget; `index`: the block's place in forward order),
    a block past the budget runs as in "hidden_states": its policy's outputs recomputed, not offloaded."""

    def __init__(self, block: nn.Module, manager, policy, min_bytes: int, use_reentrant: bool = False,
                 fit_prefetch_depth: bool = False, kept_bytes: KeptBytes = None):
        super().__init__(block)
        self.manager, self.policy, self.min_bytes, self.use_reentrant = manager, policy, min_bytes, use_reentrant
        self.kept_bytes = kept_bytes
        self.checkpoint = block_checkpoint(manager, fit_prefetch_depth)
        self.link, self.index = None, 0
        self.scoping = None  # set by Selective.after_wrapping for a named policy

    def __call__(self, *args, **kwargs):
        if not self.training_with_grad():
            return self.run(*args, **kwargs)
        if self.link is not None:
            offload = self.link.offloads_policy(self.index)
            self.link.count_block(_first_tensor_bytes(args, kwargs), offload)
            if not offload:
                return checkpoint(self.run, *args, manager=self.manager, use_reentrant=self.use_reentrant, **kwargs)
        return self.checkpoint(self.run, *args, policy=self.policy, manager=self.manager,
                               min_bytes=self.min_bytes, block=self.block, use_reentrant=self.use_reentrant,
                               kept_bytes=self.kept_bytes, scoping=self.scoping, **kwargs)


def block_prefetch_depth(blocks, policies) -> int:
    """The prefetch depth that lets backward prefetch the next block's saves, so that it never waits
    on their copies: the most any block saves under its policy (this also fails now for a block
    without its policy's projections). The saves counted in each block's first forward raise it
    where a block makes more (FirstForwardDepth)."""
    return max(saves_per_block(policy, block) if is_fast_policy(policy) else SAVES_PER_BLOCK
               for block, policy in zip(blocks, policies))


def scope_blocks(handle, blocks, policies) -> list:
    """Each block's policies.interception.BlockScoping under its policy (None for a policy function or
    a block without an attention module the presets find); handle.remove() takes their hooks off."""
    scopings = []
    for block, policy in zip(blocks, policies):
        scoping, hooks = scope_block(block, projection_groups(policy)) if is_fast_policy(policy) else (None, ())
        handle.on_remove(*hooks)
        scopings.append(scoping)
    return scopings


class Selective(CheckpointInstaller):
    def build_manager(self, options, blocks):
        kwargs = options.manager_kwargs()
        if options.prefetch_depth is None:
            kwargs["prefetch_depth"] = block_prefetch_depth(blocks, options.policies_for(blocks))
        return OffloadManager(**kwargs)

    def wrappers(self, blocks, manager, options, chose_depth):
        # The products "keep_<group>" groups keep, counted in the manager's stats (mode "auto" reads them).
        kept_bytes = KeptBytes()
        register_stats_source(manager, kept_bytes)
        return [SelectiveForward(block, manager, policy, options.min_bytes, options.use_reentrant, chose_depth,
                                 kept_bytes)
                for block, policy in zip(blocks, options.policies_for(blocks))]

    def after_wrapping(self, handle, wrappers, options) -> None:
        scopings = scope_blocks(handle, [w.block for w in wrappers], [w.policy for w in wrappers])
        for wrapper, scoping in zip(wrappers, scopings):
            wrapper.scoping = scoping
        if options.link_throttle:
            budget = PolicyLinkBudget(handle.manager, len(wrappers))
            for index, wrapper in enumerate(wrappers):
                wrapper.link, wrapper.index = budget, index
            handle.link_budget = budget
            handle.on_remove(*budget.watch(handle.model))
