"""Finding a model's repeated blocks (the decoder layers) and checking the ones a user names, and the
forwards we install on them."""
from typing import List

import torch
from torch import nn

from .copies import NotPicklable, copy_attributes

# Attribute paths where Hugging Face decoder-only models keep their layer stack (PEFT models wrap
# them twice: PeftModel.base_model.model is the transformers model).
_HF_LAYER_PATHS = ("model.layers", "model.decoder.layers", "transformer.h", "transformer.layers",
                   "gpt_neox.layers", "layers", "base_model.model.model.layers")


def _resolve(model: nn.Module, path: str):
    obj = model
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def find_blocks(model: nn.Module) -> List[nn.Module]:
    """The repeated blocks of a transformer: the decoder-layer ModuleList of a HF model."""
    for path in _HF_LAYER_PATHS:
        layers = _resolve(model, path)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return list(layers)
    raise ValueError(
        "torch_offload: could not find the model's decoder layers (looked at "
        + ", ".join(_HF_LAYER_PATHS)
        + "); pass them explicitly with blocks=[...]"
    )


def blocks_to_wrap(model: nn.Module, blocks) -> List[nn.Module]:
    """`blocks` (default: the model's decoder layers, find_blocks), checked: not empty, not wrapped
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


class BlockForward(NotPicklable):
    """A forward that apply() or offload_layers() installs on a block (base class; subclasses
    define __call__). An object, not a closure: copy.deepcopy(model) then binds the copy's wrapper
    to the copy's block and the copy's inner wrapper (copies.py), so the copy computes with its
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

    def __deepcopy__(self, memo):
        return copy_attributes(self, memo)


def set_forward(block: nn.Module, forward) -> None:
    """Installs `forward` (a wrapper), or with None goes back to the class's forward."""
    if forward is None:
        block.__dict__.pop("forward", None)
    else:
        block.forward = forward
