"""mode="hidden_states": each block runs under torch_offload.checkpoint (its input goes to host
memory, the block is recomputed in backward from the prefetched input)."""
import torch
from torch import nn

from ..checkpoint import checkpoint
from ..handle import OffloadHandle, blocks_to_wrap
from ..manager import OffloadManager
from .options import MANAGER_OPTIONS, check_options

# Every block input is offloaded, whatever its size.
_WHY = {"min_bytes": "mode='hidden_states' offloads each block's input whatever its size; min_bytes "
                     "is for modes 'all', 'sync', 'disk' and 'modules'"}


def apply_hidden_states(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    check_options("hidden_states", options, manager, MANAGER_OPTIONS, _WHY)
    blocks = blocks_to_wrap(model, blocks)
    manager = manager if manager is not None else OffloadManager(**options)
    handle = OffloadHandle(model, "hidden_states", manager)
    for block in blocks:
        handle.wrap(block, lambda b, forward: _checkpointed_forward(b, forward, manager))
    handle.disable_hf_checkpointing()  # ours replaces it (twice would recompute twice)
    handle.disable_kv_cache()
    return handle


def _checkpointed_forward(block: nn.Module, forward, manager):
    def forward_with_offload(*args, **kwargs):
        if block.training and torch.is_grad_enabled():
            return checkpoint(forward, *args, manager=manager, **kwargs)
        return forward(*args, **kwargs)

    return forward_with_offload
