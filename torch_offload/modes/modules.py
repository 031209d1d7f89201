"""mode="modules": only the activations saved inside the submodules that `targets` (name patterns,
module classes) and `presets` (Megatron-style groups such as "qkv", "core_attn") select are offloaded
(targets/module_offload.py); handle.report() gives the bytes expected and freed."""
import dataclasses

from ..hooks.link_budget import watch_link
from ..targets.module_offload import PREFETCH_DEPTH, offload_modules
from .first_restores import prefetch_first_restores
from .mode import Mode
from .options import ActivationsOptions, OptionError


@dataclasses.dataclass(frozen=True)
class ModulesOptions(ActivationsOptions):
    """Options of mode="modules": those of "all", and

    targets: fnmatch patterns on qualified module names ("*.self_attn") or module classes.
    presets: named module groups (targets/presets.py: core_attn, qkv, out_proj, attn, fc1, fc2, mlp,
        moe_router, moe_experts). At least one of targets and presets.
    prefetch_depth: saves copied back ahead of need in backward (default 8: a selected attention
        makes 5-6 copies per layer).
    """

    targets: object = None
    presets: object = None
    prefetch_depth: int = PREFETCH_DEPTH

    def __post_init__(self):
        super().__post_init__()
        if not self.targets and not self.presets:
            raise OptionError("mode='modules' needs targets=[name patterns or module classes] and/or "
                              "presets=[preset names, e.g. 'qkv', 'core_attn']")


class Modules(Mode):
    name = "modules"
    options_type = ModulesOptions
    wraps_blocks = False  # modules are selected by targets and presets

    def manager_kwargs(self, options: ModulesOptions, blocks) -> dict:
        return options.activation_manager_kwargs(self.name)

    def install(self, handle, blocks, options: ModulesOptions) -> None:
        model = handle.model
        handle.modules = offload_modules(model, options.targets or (), presets=options.presets or (),
                                         manager=handle.manager, min_bytes=options.min_bytes)
        watch_link(handle, model, options.keep_on_device_bytes == "auto")
        handle.disable_hf_checkpointing()  # offloaded activations need no recompute
        prefetch_first_restores(handle)  # the last selected module's saves, during the LM head's backward
