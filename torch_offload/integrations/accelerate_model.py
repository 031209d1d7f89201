"""A model prepared by accelerate (DistributedDataParallel, torch.compile or other wrappers around
it): offloading is applied to the model inside, whose decoder layers apply() can find."""
from torch import nn

from ..apply import OffloadHandle, apply


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside accelerate's wrappers (DDP/DataParallel `.module`, torch.compile's
    `_orig_mod`), found the way accelerate does (accelerate.utils.extract_model_from_parallel)."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model, keep_fp32_wrapper=True)


def apply_prepared(model: nn.Module, mode="hidden_states", **apply_options) -> OffloadHandle:
    """apply() on the model inside what accelerator.prepare(model) returned. Call it after
    prepare (the wrappers run the same inner modules, so wrapping their forwards takes effect) and
    before training; handle.remove() undoes it."""
    return apply(unwrap(model), mode, **apply_options)
