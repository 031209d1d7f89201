"""OffloadHandle: what apply() returns, and the stack of undos that remove() pops (undo.py).

Installing is an ordered list of steps (install.py); each change a step makes on the model pushes
what undoes it onto the handle's stack, so remove() undoes every change in reverse order, and a
failed install pops what it had pushed and leaves the model as it was. Mode "auto" keeps one such
handle per trial (modes/auto/controller.py)."""
import functools
import weakref
from typing import List

from torch import nn

from ._library.manager import stats as manager_stats
from .blocks import ForwardWrapper
from .undo import set_forward
from .kv_cache import disable_kv_caches
from .undo import UndoStack


class OffloadHandle(UndoStack):
    """What apply() returns: the configuration it installed (`config`, every part decided), the
    activation manager in use and its statistics (stats()), the parts' own handles where on
    (`layers`: LayerOffloadHandle, `chunked_loss`: ChunkedLossHandle, `tiled_mlp` / `tiled_norms`:
    TiledMLPHandle, `modules`: mode "modules"' ModuleOffloadHandle, `auto`: mode "auto"'s
    AutoController), what apply() decided and why (explain()), and remove()."""

    _pickled_what = "its OffloadHandle"

    def __init__(self, model: nn.Module, config=None, notes=()):
        super().__init__()
        self.model = model
        self.config = config  # the OffloadConfig installed, every part decided
        self.notes = list(notes)  # (part, chosen, why): what resolve() decided, for explain()
        self._manager = None
        self.layers = None
        self.chunked_loss = None
        self.tiled_mlp = None
        self.tiled_norms = None
        self.spill_dir = None  # the folder made for spills, removed by remove()
        self.modules = None
        self.auto = None
        self.link_budget = None  # LinkBudget with keep_on_device_bytes="auto" (hooks/link_budget.py)
        self._wrappers: List[ForwardWrapper] = []

    @property
    def manager(self):
        """The activation mode's OffloadManager (auto: the current trial's; None without one)."""
        return self.auto.manager if self.auto is not None else self._manager

    @manager.setter
    def manager(self, manager) -> None:
        self._manager = manager

    @property
    def mode(self):
        """The activation mode's name (None: no activation offloading)."""
        return None if self.config is None else self.config.mode_name

    @property
    def blocks(self) -> List[nn.Module]:
        if self.auto is not None:
            return self.auto.blocks
        return [wrapper.block for wrapper in self._wrappers]

    def stats(self) -> dict:
        """Statistics of the activation manager merged with its saved-tensor hooks' counters
        (torch_offload.stats(manager)); {} without one (mode=None, and auto while torch's
        checkpointing runs); layer offloading: `layers.stats()`."""
        if self.auto is not None:
            return self.auto.stats()
        return manager_stats(self.manager) if self.manager is not None else {}

    def report(self) -> dict:
        """modules mode: bytes the last forward offloaded and freed (see offload_modules)."""
        if self.modules is None:
            raise RuntimeError("torch_offload: report() is for mode='modules'")
        return self.modules.report()

    def explain(self) -> str:
        """What long_context=True turned on and why; mode "auto" adds what it measured and chose."""
        if not self.notes and self.auto is None:
            raise RuntimeError("torch_offload: explain() is for apply(..., long_context=True) and mode='auto'")
        parts = [self.auto.explain()] if self.auto is not None else []
        if self.notes:
            lines = ["torch_offload long_context=True", "", "| part | chosen | why |", "|---|---|---|"]
            lines += [f"| {part} | {chosen} | {why} |" for part, chosen, why in self.notes]
            for what, tiled in (("MLP", self.tiled_mlp), ("norm", self.tiled_norms)):
                tiles = {} if tiled is None else tiled.tiles()
                if tiles:
                    lines += ["", f"tokens per {what} tile, by sequence length: "
                              + ", ".join(f"{length}: {tile}" for length, tile in sorted(tiles.items()))]
            parts.append("\n".join(lines) + "\n")
        return "\n".join(parts)

    # Changes, each with its undo pushed (push, on_remove, set_attribute, replace_forward: undo.py).

    def wrap(self, wrapper: ForwardWrapper) -> None:
        """Installs `wrapper` as its block's forward; remove() puts back the one it wraps."""
        self._wrappers.append(wrapper)
        set_forward(wrapper.block, wrapper)
        # Marks the block as wrapped. Weak: a deep copy of one block must not copy the handle and
        # through it the whole model (the copied block keeps a dead or foreign mark: still wrapped).
        wrapper.block._torch_offload_handle = weakref.ref(self)
        self.push(functools.partial(self._unwrap, wrapper))

    def _unwrap(self, wrapper: ForwardWrapper) -> None:
        set_forward(wrapper.block, wrapper.inner)
        wrapper.block.__dict__.pop("_torch_offload_handle", None)
        self._wrappers.remove(wrapper)

    def disable_hf_checkpointing(self) -> None:
        """Turns a Hugging Face model's own gradient checkpointing off (ours replaces it, or the
        mode needs no recompute); remove() turns it back on with the same checkpoint function."""
        for module in self.model.modules():
            if getattr(module, "gradient_checkpointing", False) is True:
                self.set_attribute(module, "gradient_checkpointing", False)

    def disable_kv_cache(self, call: str = "torch_offload.apply") -> None:
        """Sets use_cache=False in every Hugging Face config of the model, nested ones included
        (kv_cache.py: a KV cache cannot be filled by a recomputed layer), with a warning; remove()
        puts the old values back."""
        for config, name, value in disable_kv_caches(self.model, call):
            self.push(functools.partial(setattr, config, name, value))

    def remove(self) -> None:
        try:
            super().remove()
        finally:
            self.layers = self.chunked_loss = self.tiled_mlp = self.tiled_norms = None
