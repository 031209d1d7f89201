"""apply(model, mode=...): turns offloading on for a model's blocks (decoder layers)."""
import warnings
from typing import Iterable, List, Optional

import torch
from torch import nn

from .activations import MODE_ALIASES, canonical_mode, offload_activations
from .checkpoint import checkpoint
from .manager import OffloadManager

MODES = ("hidden_states",) + tuple(sorted(MODE_ALIASES))

# Attribute paths where Hugging Face decoder-only models keep their layer stack.
_HF_LAYER_PATHS = ("model.layers", "model.decoder.layers", "transformer.h", "transformer.layers",
                   "gpt_neox.layers", "layers")


class OffloadHandle:
    """What apply() returns: the manager in use, its statistics, and remove() to undo apply()."""

    def __init__(self, model: nn.Module, blocks: List[nn.Module], manager, mode: str):
        self.model = model
        self.blocks = blocks
        self.manager = manager
        self.mode = mode

    def stats(self) -> dict:
        return dict(self.manager.stats())

    def remove(self) -> None:
        for block in self.blocks:
            if "forward" in block.__dict__:
                del block.forward
            block.__dict__.pop("_torch_offload_handle", None)
        self.blocks = []


def _resolve(model: nn.Module, path: str):
    obj = model
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def find_blocks(model: nn.Module) -> List[nn.Module]:
    """The repeated blocks of a transformer: the decoder-layer ModuleList of a HF model."""
    for path in _HF_LAYER_PATHS:
        layers = _resolve(model, path)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return list(layers)
    raise ValueError(
        "torch_offload.apply: could not find the model's decoder layers (looked at "
        + ", ".join(_HF_LAYER_PATHS)
        + "); pass them explicitly with blocks=[...]"
    )


def apply(
    model: nn.Module,
    mode: str = "hidden_states",
    blocks: Optional[Iterable[nn.Module]] = None,
    manager=None,
    **manager_options,
) -> OffloadHandle:
    """Turns on offloading for `model` and returns an OffloadHandle.

    mode="all" (alias "true", or True) / "sync" (alias "legacy"): the activations that autograd saves
    inside every block but the last are offloaded (see offload_activations); parameters, buffers,
    small tensors, the last block and everything after it (the LM head) stay on the GPU. Extra
    options: min_bytes, max_in_flight, prefetch_depth, host_budget_bytes.

    mode="hidden_states": each block runs under torch_offload.checkpoint while the model is training
    and grad is enabled: its input (the hidden states) moves to pinned host memory during forward
    and comes back, prefetched, when backward recomputes the block. `blocks` defaults to the
    decoder layers of a Hugging Face model (Llama, Qwen, Mistral and similar); pass any list of
    modules for other models. `manager` defaults to a new OffloadManager built from
    `manager_options` (max_in_flight, prefetch_depth, host_budget_bytes).
    """
    if mode is not True and mode not in MODES:
        raise ValueError(f"torch_offload.apply: unknown mode {mode!r}; expected one of {MODES}")
    blocks = list(blocks) if blocks is not None else find_blocks(model)
    if not blocks:
        raise ValueError("torch_offload.apply: blocks is empty")
    if manager is not None and manager_options:
        raise ValueError("torch_offload.apply: pass either manager or manager options, not both")
    if mode == "hidden_states":
        manager = manager if manager is not None else OffloadManager(**manager_options)
        wrap = lambda block: _checkpointed_forward(block, _own_forward(block), manager)  # noqa: E731
        wrapped = blocks
    else:
        mode = canonical_mode(mode)
        resident = list(model.parameters()) + list(model.buffers())
        hooks = offload_activations(mode, manager=manager, keep=resident, **manager_options)
        manager = hooks.manager
        wrap = lambda block: _hooked_forward(block, _own_forward(block), hooks)  # noqa: E731
        wrapped = blocks[:-1]  # the last block feeds the LM head right away: keep it resident

    if getattr(model, "is_gradient_checkpointing", False):
        # Checkpointing twice would recompute twice; ours replaces the model's own.
        model.gradient_checkpointing_disable()
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        warnings.warn("torch_offload.apply: setting config.use_cache=False (a KV cache cannot be "
                      "filled by a recomputed layer)")
        config.use_cache = False

    if any("_torch_offload_handle" in block.__dict__ for block in blocks):
        raise ValueError("torch_offload.apply: a block is already wrapped; call remove() first")
    handle = OffloadHandle(model, wrapped, manager, mode)
    for block in wrapped:
        block._torch_offload_handle = handle
        block.forward = wrap(block)
    return handle


def _own_forward(block: nn.Module):
    return type(block).forward.__get__(block)


def _checkpointed_forward(block: nn.Module, forward, manager):
    def forward_with_offload(*args, **kwargs):
        if block.training and torch.is_grad_enabled():
            return checkpoint(forward, *args, manager=manager, **kwargs)
        return forward(*args, **kwargs)

    return forward_with_offload


def _hooked_forward(block: nn.Module, forward, hooks):
    def forward_with_offload(*args, **kwargs):
        if block.training and torch.is_grad_enabled():
            with hooks:
                return forward(*args, **kwargs)
        return forward(*args, **kwargs)

    return forward_with_offload
