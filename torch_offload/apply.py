"""apply(model, mode=...): turns offloading on for a model's blocks (decoder layers)."""
import warnings
from typing import Iterable, List, Optional

import torch
from torch import nn

from .activations import MODE_ALIASES, canonical_mode, offload_activations, resident_tensors
from .blocks import current_forward, find_blocks, set_forward
from .checkpoint import checkpoint
from .layers import offload_layers
from .manager import OffloadManager
from .modules import offload_modules

MODES = ("hidden_states", "modules") + tuple(sorted(MODE_ALIASES))


class OffloadHandle:
    """What apply() returns: the manager in use and its statistics, the layer offloading
    (`layers`, when asked for) and the modules-mode report, and remove() to undo apply()."""

    def __init__(self, model: nn.Module, mode, manager, layers=None, modules=None):
        self.model = model
        self.mode = mode
        self.manager = manager
        self.layers = layers  # LayerOffloadHandle with layer_offloading=True
        self.modules = modules  # ModuleOffloadHandle in "modules" mode
        self.blocks: List[nn.Module] = []
        self._previous_forwards = []

    def stats(self) -> dict:
        """Statistics of the activation manager (layer offloading: `layers.stats()`)."""
        return dict(self.manager.stats()) if self.manager is not None else {}

    def report(self) -> dict:
        """modules mode: bytes the last forward offloaded and freed (see offload_modules)."""
        if self.modules is None:
            raise RuntimeError("torch_offload: report() is for mode='modules'")
        return self.modules.report()

    def remove(self) -> None:
        for block, previous in zip(self.blocks, self._previous_forwards):
            set_forward(block, previous)
            block.__dict__.pop("_torch_offload_handle", None)
        self.blocks, self._previous_forwards = [], []
        if self.modules is not None:
            self.modules.remove()
        if self.layers is not None:
            self.layers.remove()
            self.layers = None

    def _wrap(self, block: nn.Module, wrapper) -> None:
        self._previous_forwards.append(block.__dict__.get("forward"))
        self.blocks.append(block)
        block._torch_offload_handle = self
        set_forward(block, wrapper(block, current_forward(block)))


def apply(
    model: nn.Module,
    mode="hidden_states",
    blocks: Optional[Iterable[nn.Module]] = None,
    manager=None,
    *,
    layer_offloading: bool = False,
    targets=None,
    **manager_options,
) -> OffloadHandle:
    """Turns on offloading for `model` and returns an OffloadHandle.

    mode="hidden_states": each block runs under torch_offload.checkpoint while the model is training
    and grad is enabled: its input (the hidden states) moves to pinned host memory during forward
    and comes back, prefetched, when backward recomputes the block.

    mode="all" (alias "true", or True) / "sync" (alias "legacy") / "disk": the activations that
    autograd saves inside every block but the last are offloaded (see offload_activations);
    parameters, buffers, small tensors, the last block and everything after it (the LM head) stay
    on the GPU. Extra options: min_bytes, max_in_flight, prefetch_depth, host_budget_bytes.

    mode="modules": only the activations saved inside the submodules `targets` selects (name
    patterns such as "*.self_attn" or module classes) are offloaded; handle.report() gives the
    bytes expected and freed (see offload_modules).

    mode=None: no activation offloading (with layer_offloading=True: layer offloading only).

    layer_offloading=True: the frozen weights of every block also live in host memory and are
    brought to the GPU only while the block runs (see offload_layers); handle.layers.stats().

    `blocks` defaults to the decoder layers of a Hugging Face model (Llama, Qwen, Mistral and
    similar, PEFT-wrapped too); pass any list of modules for other models. `manager` defaults to
    a new OffloadManager built from `manager_options` (max_in_flight, prefetch_depth,
    host_budget_bytes, or node_host_budget_bytes: the host memory shared by the ranks of a node,
    split evenly by LOCAL_WORLD_SIZE).
    """
    if mode is not True and mode is not None and mode not in MODES:
        raise ValueError(f"torch_offload.apply: unknown mode {mode!r}; expected one of {MODES} or None")
    if mode == "modules" and not targets:
        raise ValueError("torch_offload.apply: mode='modules' needs targets=[name patterns or module classes]")
    if targets is not None and mode != "modules":
        raise ValueError("torch_offload.apply: targets is for mode='modules'")
    if manager is not None and manager_options:
        raise ValueError("torch_offload.apply: pass either manager or manager options, not both")
    if mode is None and (manager is not None or manager_options):
        raise ValueError("torch_offload.apply: manager and its options are for activation offloading "
                         "(mode=None has none; offload_layers takes its own)")
    blocks = list(blocks) if blocks is not None else None
    if mode not in (None, "modules") or layer_offloading:  # modes that wrap the blocks
        blocks = blocks if blocks is not None else find_blocks(model)
        if not blocks:
            raise ValueError("torch_offload.apply: blocks is empty")
        if any("_torch_offload_handle" in block.__dict__ for block in blocks):
            raise ValueError("torch_offload.apply: a block is already wrapped; call remove() first")

    # Layer offloading goes innermost: its weights must be on the device inside the checkpoint's
    # recompute and inside activation hooks.
    layers = offload_layers(model, blocks) if layer_offloading else None
    try:
        handle = _apply_mode(model, mode, blocks, manager, layers, targets, manager_options)
    except Exception:
        if layers is not None:
            layers.remove()
        raise
    if mode is not None and getattr(model, "is_gradient_checkpointing", False):
        # Checkpointing twice would recompute twice; ours replaces the model's own (and modules
        # mode offloads instead of recomputing).
        model.gradient_checkpointing_disable()
    config = getattr(model, "config", None)
    if mode == "hidden_states" and config is not None and getattr(config, "use_cache", False):
        warnings.warn("torch_offload.apply: setting config.use_cache=False (a KV cache cannot be "
                      "filled by a recomputed layer)")
        config.use_cache = False
    return handle


def _apply_mode(model, mode, blocks, manager, layers, targets, manager_options) -> OffloadHandle:
    if mode is None:
        return OffloadHandle(model, None, manager, layers=layers)
    if mode == "modules":
        modules = offload_modules(model, targets, manager=manager, **manager_options)
        return OffloadHandle(model, mode, modules.manager, layers=layers, modules=modules)
    if mode == "hidden_states":
        manager = manager if manager is not None else OffloadManager(**manager_options)
        handle = OffloadHandle(model, mode, manager, layers=layers)
        for block in blocks:
            handle._wrap(block, lambda b, forward: _checkpointed_forward(b, forward, manager))
        return handle
    mode = canonical_mode(mode)
    hooks = offload_activations(mode, manager=manager, keep=resident_tensors(model), **manager_options)
    handle = OffloadHandle(model, mode, hooks.manager, layers=layers)
    for block in blocks[:-1]:  # the last block feeds the LM head right away: keep it resident
        handle._wrap(block, lambda b, forward: _hooked_forward(b, forward, hooks))
    return handle


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
