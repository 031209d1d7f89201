"""OffloadHandle: what apply() returns, and how it undoes what apply() changed."""
import weakref
from typing import List

from torch import nn

from ._engine.manager import stats as manager_stats
from .blocks import BlockForward, set_forward
from .copies import NotPicklable, copy_attributes
from .kv_cache import disable_kv_caches


class OffloadHandle(NotPicklable):
    """What apply() returns: the manager in use and its statistics, the layer offloading
    (`layers`) and chunked loss (`chunked_loss`) when asked for, the modules-mode report, and
    remove() to undo apply().

    Everything remove() needs is data (wrappers, hook handles, (object, attribute, value) to put
    back), not closures: copy.deepcopy((model, handle)) gives the copy's handle (copies.py)."""

    _pickled_what = "its OffloadHandle"

    def __init__(self, model: nn.Module, mode, manager, layers=None, modules=None):
        self.model = model
        self.mode = mode
        self.manager = manager
        self.layers = layers  # LayerOffloadHandle with layer_offloading=True
        self.modules = modules  # ModuleOffloadHandle in "modules" mode
        self.chunked_loss = None  # ChunkedLossHandle with chunked_loss=
        self.long_context = None  # LongContextPlan with long_context=True (its tiled MLP, spill folder)
        self.link_budget = None  # LinkBudget with keep_on_device_bytes="auto" (link_budget.py)
        self._wrappers: List[BlockForward] = []
        self._hook_handles = []  # torch.utils.hooks.RemovableHandle
        self._attributes = []  # (object, name, value apply() changed it from)

    @property
    def blocks(self) -> List[nn.Module]:
        return [wrapper.block for wrapper in self._wrappers]

    def __deepcopy__(self, memo):
        return copy_attributes(self, memo)

    def stats(self) -> dict:
        """Statistics of the activation manager merged with its saved-tensor hooks' counters
        (torch_offload.stats(manager)); layer offloading: `layers.stats()`."""
        return manager_stats(self.manager) if self.manager is not None else {}

    def report(self) -> dict:
        """modules mode: bytes the last forward offloaded and freed (see offload_modules)."""
        if self.modules is None:
            raise RuntimeError("torch_offload: report() is for mode='modules'")
        return self.modules.report()

    def explain(self) -> str:
        """What long_context=True turned on and why (mode "auto" adds what it measured and chose)."""
        if self.long_context is None:
            raise RuntimeError("torch_offload: explain() is for apply(..., long_context=True) and mode='auto'")
        return self.long_context.explain()

    def remove(self) -> None:
        if self.long_context is not None:
            self.long_context.remove()
            self.long_context = None
        for wrapper in self._wrappers:
            set_forward(wrapper.block, wrapper.inner)
            wrapper.block.__dict__.pop("_torch_offload_handle", None)
        self._wrappers = []
        if self.modules is not None:
            self.modules.remove()
        if self.layers is not None:
            self.layers.remove()
            self.layers = None
        if self.chunked_loss is not None:
            self.chunked_loss.remove()
            self.chunked_loss = None
        for hook in self._hook_handles:
            hook.remove()
        self._hook_handles = []
        while self._attributes:
            setattr(*self._attributes.pop())

    def on_remove(self, *hook_handles) -> None:
        """remove() also removes these hooks (torch.utils.hooks.RemovableHandle)."""
        self._hook_handles.extend(hook_handles)

    def disable_hf_checkpointing(self) -> None:
        """Turns a Hugging Face model's own gradient checkpointing off (ours replaces it, or the
        mode needs no recompute); remove() turns it back on with the same checkpoint function."""
        for module in self.model.modules():
            if getattr(module, "gradient_checkpointing", False) is True:
                self._attributes.append((module, "gradient_checkpointing", True))
                module.gradient_checkpointing = False

    def disable_kv_cache(self) -> None:
        """Sets use_cache=False in every Hugging Face config of the model, nested ones included
        (kv_cache.py: a KV cache cannot be filled by a recomputed layer), with a warning; remove()
        puts the old values back."""
        self._attributes.extend(disable_kv_caches(self.model, "torch_offload.apply"))

    def wrap(self, wrapper: BlockForward) -> None:
        """Installs `wrapper` as its block's forward; remove() puts back the one it wraps."""
        self._wrappers.append(wrapper)
        set_forward(wrapper.block, wrapper)
        # Marks the block as wrapped. Weak: a deep copy of one block must not copy the handle and
        # through it the whole model (the copied block keeps a dead or foreign mark: still wrapped).
        wrapper.block._torch_offload_handle = weakref.ref(self)
