"""mode="modules": only the activations saved inside the submodules `targets` selects are
offloaded (see torch_offload.modules.offload_modules)."""
from torch import nn

from ..handle import OffloadHandle
from ..modules import offload_modules


def apply_modules(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    options = dict(options)
    targets = options.pop("targets", None)
    if not targets:
        raise ValueError("torch_offload.apply: mode='modules' needs targets=[name patterns or module classes]")
    modules = offload_modules(model, targets, manager=manager, **options)
    handle = OffloadHandle(model, "modules", modules.manager, modules=modules)
    if getattr(model, "is_gradient_checkpointing", False):
        model.gradient_checkpointing_disable()  # offloaded activations need no recompute
    return handle
