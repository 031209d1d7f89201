"""OffloadHandle: what apply() returns, and how it undoes what apply() changed."""
import warnings
from typing import Callable, List

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
        self._undo: List[Callable[[], None]] = []  # puts back model state apply() changed

    def stats(self) -> dict:
        """Statistics of the activation manager merged with its saved-tensor hooks' counters
        (torch_offload.stats(manager)); layer offloading: `layers.stats()`."""
        from .manager import stats

        return stats(self.manager) if self.manager is not None else {}

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
        while self._undo:
            self._undo.pop()()

    def on_remove(self, *hook_handles) -> None:
        """remove() also removes these hooks (torch.utils.hooks.RemovableHandle)."""
        self._undo.extend(h.remove for h in hook_handles)

    def disable_hf_checkpointing(self) -> None:
        """Turns a Hugging Face model's own gradient checkpointing off (ours replaces it, or the
        mode needs no recompute); remove() turns it back on with the same checkpoint function."""
        flags = [(m, m.gradient_checkpointing) for m in self.model.modules()
                 if getattr(m, "gradient_checkpointing", False) is True]
        for module, _ in flags:
            module.gradient_checkpointing = False

        def restore():
            for module, flag in flags:
                module.gradient_checkpointing = flag

        self._undo.append(restore)

    def disable_kv_cache(self) -> None:
        """Sets a Hugging Face config's use_cache=False (a KV cache cannot be filled by a recomputed
        layer), with a warning; remove() puts the old value back."""
        config = getattr(self.model, "config", None)
        if config is None or not getattr(config, "use_cache", False):
            return
        warnings.warn("torch_offload.apply: setting config.use_cache=False (a KV cache cannot be "
                      "filled by a recomputed layer); handle.remove() sets it back")
        previous = config.use_cache
        config.use_cache = False
        self._undo.append(lambda: setattr(config, "use_cache", previous))

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
    if len({id(block) for block in blocks}) != len(blocks):
        # Wrapping one module twice would nest the wrappers, and remove() would leave one behind.
        raise ValueError("torch_offload.apply: blocks lists the same module more than once")
    return blocks
