"""mode="all" (alias "true") / "sync" (alias "legacy") / "disk": the activations autograd saves inside
every block but the last go through offload_activations' hooks; nothing is recomputed. The last block
feeds the LM head right away, so its activations stay resident.

keep_on_device_bytes="auto" (modes "all" and "modules"): the window of saves kept on the GPU is sized
after every training step from the link (hooks/link_budget.py).
"""
from torch import nn

from ..blocks import ForwardWrapper
from ..hooks.nothing_offloaded import warn_nothing_offloaded, watch_model_steps
from ..hooks.link_budget import watch_link
from ..hooks.offload_hooks import offload_activations, resident_tensors
from .installer import ModeInstaller


class HookedForward(ForwardWrapper):
    """A block's forward inside the save hooks while training with grad enabled."""

    def __init__(self, block: nn.Module, hooks):
        super().__init__(block)
        self.hooks = hooks

    def __call__(self, *args, **kwargs):
        if self.training_with_grad():
            with self.hooks:
                return self.run(*args, **kwargs)
        return self.run(*args, **kwargs)


class Activations(ModeInstaller):
    """Modes "all", "sync" and "disk"."""

    def install(self, handle, blocks, options, manager=None) -> None:
        if len(blocks) == 1:
            warn_nothing_offloaded(
                f"torch_offload.apply(mode={options.mode_name!r}): the model has one block, and the last block's "
                "activations stay on the device (backward needs them first), so nothing is offloaded; pass more "
                "blocks (blocks=[...]: e.g. the block's submodules) or use mode='hidden_states'")
        handle.manager = manager if manager is not None else self.build_manager(options, blocks)
        model = handle.model
        hooks = offload_activations(options.mode_name, manager=handle.manager, keep=resident_tensors(model),
                                    min_bytes=options.min_bytes, warn_on_exit=False)
        handle.on_remove(*watch_model_steps(model, hooks))
        watch_link(handle, model, options.keep_on_device_bytes == "auto")
        for block in blocks[:-1]:  # the last block feeds the LM head right away: keep it resident
            handle.wrap(HookedForward(block, hooks))
        handle.disable_hf_checkpointing()  # offloaded activations need no recompute
