"""mode="modules": only the activations saved inside the submodules `targets` and `presets` select
are offloaded (see torch_offload.modules.offload_modules, torch_offload.module_presets)."""
from torch import nn

from ..first_restores import prefetch_first_restores
from ..handle import OffloadHandle
from ..modules import offload_modules
from .options import ACTIVATION_OPTIONS, check_options, take_link_budget, watch_link


def apply_modules(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    check_options("modules", options, manager, ("targets", "presets") + ACTIVATION_OPTIONS)
    options, link_budget = take_link_budget("modules", options)
    targets, presets = options.pop("targets", None), options.pop("presets", None)
    if not targets and not presets:
        raise ValueError("torch_offload.apply: mode='modules' needs targets=[name patterns or module classes] "
                         "and/or presets=[preset names, e.g. 'qkv', 'core_attn']")
    modules = offload_modules(model, targets or (), presets=presets or (), manager=manager, **options)
    handle = OffloadHandle(model, "modules", modules.manager, modules=modules)
    watch_link(handle, model, link_budget)
    handle.disable_hf_checkpointing()  # offloaded activations need no recompute
    prefetch_first_restores(handle)  # the last selected module's saves, during the LM head's backward
    return handle
