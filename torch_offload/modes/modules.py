"""mode="modules": only the activations saved inside the submodules that `targets` (name patterns,
module classes) and `presets` (Megatron-style groups such as "qkv", "core_attn") select are offloaded
(targets/module_offload.py); handle.report() gives the bytes expected and freed."""
from ..hooks.link_budget import watch_link
from ..targets.module_offload import offload_modules
from .first_restores import prefetch_first_restores
from .installer import ModeInstaller


class Modules(ModeInstaller):
    wraps_blocks = False  # modules are selected by targets and presets

    def install(self, handle, blocks, options, manager=None) -> None:
        handle.manager = manager if manager is not None else self.build_manager(options, blocks)
        model = handle.model
        handle.modules = offload_modules(model, options.targets or (), presets=options.presets or (),
                                         manager=handle.manager, min_bytes=options.min_bytes)
        handle.push(handle.modules.remove)
        watch_link(handle, model, options.keep_on_device_bytes == "auto")
        handle.disable_hf_checkpointing()  # offloaded activations need no recompute
        prefetch_first_restores(handle)  # the last selected module's saves, during the LM head's backward
