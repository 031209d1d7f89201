"""mode="hidden_states": each block runs under torch_offload.checkpoint (its input goes to host
memory, the block is recomputed in backward from the prefetched input). use_reentrant=True: our
reentrant variant of the checkpoint (reentrant.py)."""
from torch import nn

from ..blocks import BlockForward
from ..checkpoint import checkpoint
from ..first_restores import prefetch_first_restores
from ..handle import OffloadHandle, blocks_to_wrap
from ..manager import OffloadManager
from .options import MANAGER_OPTIONS, check_options, check_use_reentrant

# Every block input is offloaded, whatever its size.
_WHY = {"min_bytes": "mode='hidden_states' offloads each block's input whatever its size; min_bytes "
                     "is for modes 'all', 'sync', 'disk' and 'modules'"}


def apply_hidden_states(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    check_options("hidden_states", options, manager, MANAGER_OPTIONS + ("use_reentrant",), _WHY)
    options = dict(options)
    use_reentrant = check_use_reentrant("hidden_states", options.pop("use_reentrant", False))
    blocks = blocks_to_wrap(model, blocks)
    manager = manager if manager is not None else OffloadManager(**options)
    handle = OffloadHandle(model, "hidden_states", manager)
    for block in blocks:
        handle.wrap(_CheckpointedForward(block, manager, use_reentrant))
    handle.disable_hf_checkpointing()  # ours replaces it (twice would recompute twice)
    handle.disable_kv_cache()
    prefetch_first_restores(handle)  # the last block's saves, during the LM head's backward
    return handle


class _CheckpointedForward(BlockForward):
    def __init__(self, block: nn.Module, manager, use_reentrant: bool = False):
        super().__init__(block)
        self.manager, self.use_reentrant = manager, use_reentrant

    def __call__(self, *args, **kwargs):
        if self.training_with_grad():
            return checkpoint(self.run, *args, manager=self.manager, use_reentrant=self.use_reentrant, **kwargs)
        return self.run(*args, **kwargs)
