"""mode="selective": each block runs under torch_offload.selective_checkpoint: its input goes to
host memory, the op outputs the policy offloads (default "attention": the fused attention outputs)
are offloaded instead of recomputed, and the rest of the block is recomputed in backward."""
from torch import nn

from ..blocks import BlockForward
from ..handle import OffloadHandle, blocks_to_wrap
from ..manager import OffloadManager
from ..attention_offload import FAST_POLICIES, projection_weights
from ..attention_offload import SAVES_PER_BLOCK as FAST_SAVES_PER_BLOCK
from ..policies import SAVES_PER_BLOCK, resolve
from ..selective import DEFAULT_MIN_BYTES
from ..selective import checkpoint as selective_checkpoint
from .options import MANAGER_OPTIONS, check_options


def apply_selective(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    check_options("selective", options, manager, MANAGER_OPTIONS + ("policy", "min_bytes"))
    options = dict(options)
    policy = options.pop("policy", "attention")
    min_bytes = options.pop("min_bytes", DEFAULT_MIN_BYTES)
    if policy not in FAST_POLICIES:
        resolve(policy, "torch_offload.apply(mode='selective')")  # fail now, not at the first forward
    blocks = blocks_to_wrap(model, blocks)
    if policy == "attention_qkv":
        for block in blocks:
            projection_weights(block)  # fail now for a block without q/k/v projections
    # Backward prefetches the next block's saves, so that it never waits on their copies.
    options.setdefault("prefetch_depth", FAST_SAVES_PER_BLOCK.get(policy, SAVES_PER_BLOCK))
    manager = manager if manager is not None else OffloadManager(**options)
    handle = OffloadHandle(model, "selective", manager)
    for block in blocks:
        handle.wrap(_SelectiveForward(block, manager, policy, min_bytes))
    handle.disable_hf_checkpointing()  # ours replaces it (twice would recompute twice)
    handle.disable_kv_cache()
    return handle


class _SelectiveForward(BlockForward):
    def __init__(self, block: nn.Module, manager, policy, min_bytes: int):
        super().__init__(block)
        self.manager, self.policy, self.min_bytes = manager, policy, min_bytes

    def __call__(self, *args, **kwargs):
        if self.training_with_grad():
            return selective_checkpoint(self.run, *args, policy=self.policy, manager=self.manager,
                                        min_bytes=self.min_bytes, block=self.block, **kwargs)
        return self.run(*args, **kwargs)
