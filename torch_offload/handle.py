"""OffloadHandle: what apply() returns, and how it undoes what apply() changed."""
from typing import List

from torch import nn

from .blocks import current_forward, find_blocks, set_forward


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

    def wrap(self, block: nn.Module, wrapper) -> None:
        """Installs wrapper(block, forward) as `block`'s forward; remove() puts the old one back."""
        self._previous_forwards.append(block.__dict__.get("forward"))
        self.blocks.append(block)
        block._torch_offload_handle = self
        set_forward(block, wrapper(block, current_forward(block)))


def blocks_to_wrap(model: nn.Module, blocks) -> List[nn.Module]:
    """`blocks` (default: the model's decoder layers), checked: not empty, not wrapped already."""
    blocks = list(blocks) if blocks is not None else find_blocks(model)
    if not blocks:
        raise ValueError("torch_offload.apply: blocks is empty")
    if any("_torch_offload_handle" in block.__dict__ for block in blocks):
        raise ValueError("torch_offload.apply: a block is already wrapped; call remove() first")
    return blocks
