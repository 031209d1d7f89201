"""Finding a model's repeated blocks (decoder layers, encoder layers, diffusion transformer blocks)
and checking the ones a user names, and the forwards we install on them."""
from typing import List

import torch
from torch import nn

from .copy_and_pickle import NotPicklable


def _declared_names(model: nn.Module) -> set:
    """The block class names the model's own classes declare repeated (diffusers' _repeated_blocks,
    read by its regional compilation)."""
    names = set()
    for module in model.modules():
        names.update(getattr(type(module), "_repeated_blocks", None) or ())
    return names


def _is_declared(module: nn.Module, names: set) -> bool:
    """Whether the module is a block its library declares: a transformers GradientCheckpointingLayer
    (what the model's own gradient checkpointing checkpoints) or a class named in _repeated_blocks."""
    kind = type(module)
    return kind.__name__ in names or any(
        c.__name__ == "GradientCheckpointingLayer" and c.__module__.startswith("transformers.") for c in kind.__mro__)


def _is_repeated_stack(module: nn.Module) -> bool:
    """A ModuleList of at least two modules of one class, each with submodules and parameters."""
    if not isinstance(module, nn.ModuleList) or len(module) < 2 or len({type(m) for m in module}) != 1:
        return False
    first = module[0]
    return next(first.children(), None) is not None and next(first.parameters(), None) is not None


def _outermost(model: nn.Module, found, skip_inside=lambda module: False) -> List[nn.Module]:
    """The modules below `model` for which found(module) holds, none inside another, in module order;
    nothing inside a module for which skip_inside(module) holds is looked at."""
    chosen, skipped = [], []
    for name, module in model.named_modules():
        if not name or any(name.startswith(prefix) for prefix in skipped):
            continue
        if found(module):
            chosen.append(module)
            skipped.append(name + ".")
        elif skip_inside(module):
            skipped.append(name + ".")
    return chosen


def find_blocks(model: nn.Module) -> List[nn.Module]:
    """The repeated blocks of a transformer, PEFT-wrapped too, in module order (the order the model
    registers them, which is the order they run in: an encoder's before a decoder's, a vision tower's
    before the language model's, Flux's double-stream before its single-stream blocks):

    1. the blocks the model's library declares, outermost: transformers' GradientCheckpointingLayer
       (the decoder, encoder and vision layers its own gradient checkpointing checkpoints) and the
       classes a diffusers model names in _repeated_blocks;
    2. else the modules of every ModuleList of at least two modules of one class (each with
       submodules and parameters) that is not inside another ModuleList.

    An architecture both miss: pass blocks=[...] to apply(), or name the block class in the model
    class's _repeated_blocks."""
    names = _declared_names(model)
    blocks = _outermost(model, lambda module: _is_declared(module, names))
    if not blocks:
        stacks = _outermost(model, _is_repeated_stack, lambda module: isinstance(module, nn.ModuleList))
        blocks = [block for stack in stacks for block in stack]
    if not blocks:
        raise ValueError(
            f"torch_offload: could not find the blocks of {type(model).__name__}: no transformers "
            "GradientCheckpointingLayer, no class named in a _repeated_blocks, no ModuleList of repeated "
            "blocks of one class; pass them explicitly with blocks=[...]"
        )
    return blocks


def blocks_to_wrap(model: nn.Module, blocks) -> List[nn.Module]:
    """`blocks` (default: the model's blocks, find_blocks), checked: not empty, not wrapped
    already by apply(), listed once."""
    blocks = list(blocks) if blocks is not None else find_blocks(model)
    if not blocks:
        raise ValueError("torch_offload.apply: blocks is empty")
    if any("_torch_offload_handle" in block.__dict__ for block in blocks):
        raise ValueError("torch_offload.apply: a block is already wrapped; call remove() first")
    if len({id(block) for block in blocks}) != len(blocks):
        # Wrapping one module twice would nest the wrappers, and remove() would leave one behind.
        raise ValueError("torch_offload.apply: blocks lists the same module more than once")
    return blocks


class ForwardWrapper(NotPicklable):
    """A forward that apply() or offload_layers() installs on a block (base class; subclasses
    define __call__). An object, not a closure: copy.deepcopy(model) then binds the copy's wrapper
    to the copy's block and the copy's inner wrapper (copy_and_pickle.py), so the copy computes with its
    own weights."""

    _pickled_what = "the forward wrapper of a block"

    def __init__(self, block: nn.Module):
        self.block = block
        # The forward this one goes around: an instance-level wrapper installed earlier (layer
        # offloading's, which must run inside checkpointing and activation hooks), else the class's.
        self.inner = block.__dict__.get("forward")
        self.class_forward = type(block).forward

    def run(self, *args, **kwargs):
        """Calls the wrapped forward."""
        if self.inner is not None:
            return self.inner(*args, **kwargs)
        return self.class_forward(self.block, *args, **kwargs)

    def training_with_grad(self) -> bool:
        return self.block.training and torch.is_grad_enabled()

