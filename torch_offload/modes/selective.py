"""mode="selective": each block runs under torch_offload.selective_checkpoint: its input goes to
host memory, the op outputs the policy offloads (default "attention": the fused attention outputs)
are offloaded instead of recomputed, and the rest of the block is recomputed in backward.
block_policies= gives each block its own policy."""
from torch import nn

from ..blocks import BlockForward
from ..first_restores import prefetch_first_restores
from ..handle import OffloadHandle, blocks_to_wrap
from ..manager import OffloadManager
from ..attention_offload import is_fast_policy, saves_per_block
from ..policies import SAVES_PER_BLOCK, resolve
from ..selective import DEFAULT_MIN_BYTES
from ..selective import checkpoint as selective_checkpoint
from .options import MANAGER_OPTIONS, check_options, check_use_reentrant


def apply_selective(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    check_options("selective", options, manager,
                  MANAGER_OPTIONS + ("policy", "block_policies", "min_bytes", "use_reentrant"))
    options = dict(options)
    use_reentrant = check_use_reentrant("selective", options.pop("use_reentrant", False))
    if "policy" in options and "block_policies" in options:
        raise ValueError("torch_offload.apply(mode='selective'): pass policy= (every block) or block_policies= "
                         "(one per block), not both")
    block_policies = options.pop("block_policies", None)
    policy = options.pop("policy", "attention")
    for named in block_policies if isinstance(block_policies, (list, tuple)) else [policy]:
        _check_policy(named, use_reentrant)  # now, not at the first forward
    blocks = blocks_to_wrap(model, blocks)
    if block_policies is None:
        block_policies = [policy] * len(blocks)
    elif not isinstance(block_policies, (list, tuple)) or len(block_policies) != len(blocks):
        length = len(block_policies) if isinstance(block_policies, (list, tuple)) else type(block_policies).__name__
        raise ValueError(f"torch_offload.apply(mode='selective'): block_policies has {length} entries for "
                         f"{len(blocks)} blocks; give one policy per block, in the blocks' order")
    min_bytes = options.pop("min_bytes", DEFAULT_MIN_BYTES)
    # Fails now for a block without its policy's projections. Backward prefetches the next block's
    # saves, so that it never waits on their copies.
    saves = max(saves_per_block(policy, block) if is_fast_policy(policy) else SAVES_PER_BLOCK
                for block, policy in zip(blocks, block_policies))
    options.setdefault("prefetch_depth", saves)
    manager = manager if manager is not None else OffloadManager(**options)
    handle = OffloadHandle(model, "selective", manager)
    for block, policy in zip(blocks, block_policies):
        handle.wrap(_SelectiveForward(block, manager, policy, min_bytes, use_reentrant))
    handle.disable_hf_checkpointing()  # ours replaces it (twice would recompute twice)
    handle.disable_kv_cache()
    prefetch_first_restores(handle)  # the last block's saves, during the LM head's backward
    return handle


def _check_policy(policy, use_reentrant: bool) -> None:
    fast = is_fast_policy(policy)  # raises for a bad projection group
    if use_reentrant and not fast:
        raise ValueError(f"torch_offload.apply(mode='selective'): use_reentrant=True takes the named policies "
                         f"('attention', 'attention+fc2', ...), got policy={policy!r}")
    if not fast:
        resolve(policy, "torch_offload.apply(mode='selective')")


class _SelectiveForward(BlockForward):
    def __init__(self, block: nn.Module, manager, policy, min_bytes: int, use_reentrant: bool = False):
        super().__init__(block)
        self.manager, self.policy, self.min_bytes, self.use_reentrant = manager, policy, min_bytes, use_reentrant

    def __call__(self, *args, **kwargs):
        if self.training_with_grad():
            return selective_checkpoint(self.run, *args, policy=self.policy, manager=self.manager,
                                        min_bytes=self.min_bytes, block=self.block,
                                        use_reentrant=self.use_reentrant, **kwargs)
        return self.run(*args, **kwargs)

