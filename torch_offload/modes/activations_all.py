"""mode="all" (alias "true") / "sync" (alias "legacy") / "disk": the activations autograd saves
inside every block but the last go through offload_activations' hooks (no recompute)."""
from torch import nn

from ..activations import offload_activations, resident_tensors
from ..blocks import BlockForward
from ..empty_steps import watch_model_steps
from ..handle import OffloadHandle, blocks_to_wrap
from .options import ACTIVATION_OPTIONS, check_options, take_link_budget, watch_link


def apply_all(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    return _apply_activations("all", model, blocks, manager, options)


def apply_sync(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    return _apply_activations("sync", model, blocks, manager, options)


def apply_disk(model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    return _apply_activations("disk", model, blocks, manager, options)


def _apply_activations(mode: str, model: nn.Module, blocks, manager, options: dict) -> OffloadHandle:
    check_options(mode, options, manager, ACTIVATION_OPTIONS)
    options, link_budget = take_link_budget(mode, options)
    blocks = blocks_to_wrap(model, blocks)
    hooks = offload_activations(mode, manager=manager, keep=resident_tensors(model), warn_on_exit=False,
                                **options)
    handle = OffloadHandle(model, mode, hooks.manager)
    handle.on_remove(*watch_model_steps(model, hooks))
    watch_link(handle, model, link_budget)
    for block in blocks[:-1]:  # the last block feeds the LM head right away: keep it resident
        handle.wrap(_HookedForward(block, hooks))
    handle.disable_hf_checkpointing()  # offloaded activations need no recompute
    return handle


class _HookedForward(BlockForward):
    def __init__(self, block: nn.Module, hooks):
        super().__init__(block)
        self.hooks = hooks

    def __call__(self, *args, **kwargs):
        if self.training_with_grad():
            with self.hooks:
                return self.run(*args, **kwargs)
        return self.run(*args, **kwargs)
