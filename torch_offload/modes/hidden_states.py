"""mode="hidden_states": each block runs under torch_offload.checkpoint (its input goes to host
memory, the block is recomputed in backward from the prefetched input)."""
import warnings

import torch
from torch import nn

from ..checkpoint import checkpoint
from ..handle import OffloadHandle, blocks_to_wrap
from ..manager import OffloadManager


def apply_hidden_states(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    blocks = blocks_to_wrap(model, blocks)
    manager = manager if manager is not None else OffloadManager(**options)
    handle = OffloadHandle(model, "hidden_states", manager)
    for block in blocks:
        handle.wrap(block, lambda b, forward: _checkpointed_forward(b, forward, manager))
    if getattr(model, "is_gradient_checkpointing", False):
        model.gradient_checkpointing_disable()  # ours replaces it (twice would recompute twice)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        warnings.warn("torch_offload.apply: setting config.use_cache=False (a KV cache cannot be "
                      "filled by a recomputed layer)")
        config.use_cache = False
    return handle


def _checkpointed_forward(block: nn.Module, forward, manager):
    def forward_with_offload(*args, **kwargs):
        if block.training and torch.is_grad_enabled():
            return checkpoint(forward, *args, manager=manager, **kwargs)
        return forward(*args, **kwargs)

    return forward_with_offload
