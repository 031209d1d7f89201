"""mode="modules": only the activations saved inside the submodules `targets` selects are
offloaded (see torch_offload.modules.offload_modules)."""
from torch import nn

from ..handle import OffloadHandle
from ..modules import offload_modules
from .options import ACTIVATION_OPTIONS, check_options


def apply_modules(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    check_options("modules", options, manager, ("targets",) + ACTIVATION_OPTIONS)
    options = dict(options)
    targets = options.pop("targets", None)
    if not targets:
        raise ValueError("torch_offload.apply: mode='modules' needs targets=[name patterns or module classes]")
    modules = offload_modules(model, targets, manager=manager, **options)
    handle = OffloadHandle(model, "modules", modules.manager, modules=modules)
    handle.disable_hf_checkpointing()  # offloaded activations need no recompute
    return handle
