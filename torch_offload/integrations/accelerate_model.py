"""A model prepared by accelerate (DistributedDataParallel, torch.compile or other wrappers around
it): offloading is applied to the model inside, whose decoder layers apply() can find."""
from torch import nn

from ..apply import OffloadHandle, apply
from .unwrapping import unwrap


def apply_prepared(model: nn.Module, mode="hidden_states", **apply_options) -> OffloadHandle:
    """apply() on the model inside what accelerator.prepare(model) returned. Call it after
    prepare (the wrappers run the same inner modules, so wrapping their forwards takes effect) and
    before training; handle.remove() undoes it."""
    return apply(unwrap(model), mode, **apply_options)


__all__ = ["apply_prepared", "unwrap"]
