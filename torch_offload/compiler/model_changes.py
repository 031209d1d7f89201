"""What torch_offload.compile() changes on the caller's model, recorded so that remove() puts it back
(compiled.offload_changes).

compile() changes the model itself, not a copy: the checkpointing its mode needs (a Hugging Face
model's own gradient checkpointing, with config.use_cache=False since a recomputed layer cannot fill
a KV cache; or a checkpointing forward on each of `blocks`), and the sdpa_is_causal and
detach_logits options. Each change is recorded as what was there before (an attribute's value or
its absence, a block's own forward, a hook handle), so remove() restores exactly the prior state,
whatever it was: a model that had gradient checkpointing on before keeps it, with its own
checkpoint function.
"""
import functools

import torch
from torch import nn

from ..blocks import set_forward
from . import hf_causal_mask, hf_logits

_ABSENT = object()  # an attribute the model did not have
# The attributes a Hugging Face model's gradient_checkpointing_enable() sets: on each module with a
# gradient_checkpointing flag, and, on the model, the input-embedding hooks that make the
# embeddings' output require grad (enable_input_require_grads).
_HF_MODULE_ATTRIBUTES = ("gradient_checkpointing", "_gradient_checkpointing_func")
_HF_MODEL_ATTRIBUTES = ("_require_grads_hooks", "_require_grads_hook")


class CompileChanges:
    """What compile() changed on the model; remove() undoes it (after remove(), train the model
    itself, or compile it again: the compiled module's graphs were traced with the changes)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._undo = []  # callables, run newest first

    def _set(self, obj, name: str, value) -> None:
        previous = getattr(obj, name, _ABSENT)
        self._undo.append(functools.partial(_put_back, obj, name, previous))
        setattr(obj, name, value)

    def sdpa_is_causal(self) -> None:
        switched = hf_causal_mask.switch(self.model)
        if switched is not None:  # None: the model had ours already, nothing of compile()'s to undo
            self._undo.append(switched.remove)

    def detach_logits(self) -> None:
        wrapper = hf_logits.install(self.model)
        if wrapper is not None:
            self._undo.append(functools.partial(_unwrap, self.model, wrapper))

    def hf_checkpointing(self, checkpoint_kwargs: dict) -> None:
        """model.gradient_checkpointing_enable(checkpoint_kwargs) and config.use_cache=False."""
        model = self.model
        previous = [(module, name, module.__dict__.get(name, _ABSENT))
                    for module in model.modules() if hasattr(module, "gradient_checkpointing")
                    for name in _HF_MODULE_ATTRIBUTES]
        previous += [(model, name, model.__dict__.get(name, _ABSENT)) for name in _HF_MODEL_ATTRIBUTES]
        hooks_before = list(getattr(model, "_require_grads_hooks", None) or ())
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs)
        added = [hook for hook in getattr(model, "_require_grads_hooks", None) or () if hook not in hooks_before]
        self._undo.append(functools.partial(_restore_hf_checkpointing, previous, added))
        if getattr(model, "config", None) is not None:
            self._set(model.config, "use_cache", False)

    def wrap_forward(self, block: nn.Module, forward) -> None:
        """block.forward = forward; remove() puts back the block's own forward (or the class's)."""
        self._undo.append(functools.partial(set_forward, block, block.__dict__.get("forward")))
        block.forward = forward

    def remove(self) -> None:
        """Puts back everything compile() changed on the model, newest first. Idempotent."""
        while self._undo:
            self._undo.pop()()


def _put_back(obj, name: str, previous) -> None:
    if previous is not _ABSENT:
        setattr(obj, name, previous)
    elif name in obj.__dict__:
        delattr(obj, name)


def _restore_hf_checkpointing(previous, added_hooks) -> None:
    for hook in added_hooks:
        hook.remove()
    for module, name, value in previous:
        _put_back(module, name, value)


def _unwrap(model: nn.Module, wrapper) -> None:
    if model.__dict__.get("forward") is wrapper:  # not replaced since (by the user)
        set_forward(model, wrapper.inner)


def checkpointed(forward, checkpoint_kwargs: dict):
    """`forward` under torch.utils.checkpoint.checkpoint with `checkpoint_kwargs`."""
    def run(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(forward, *args, **checkpoint_kwargs, **kwargs)

    return run
