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

from ..undo import ABSENT, UndoStack, put_back, set_forward
from . import hf_causal_mask, hf_logits

# The attributes a Hugging Face model's gradient_checkpointing_enable() sets: on each module with a
# gradient_checkpointing flag, and, on the model, the input-embedding hooks that make the
# embeddings' output require grad (enable_input_require_grads).
_HF_MODULE_ATTRIBUTES = ("gradient_checkpointing", "_gradient_checkpointing_func")
_HF_MODEL_ATTRIBUTES = ("_require_grads_hooks", "_require_grads_hook")


class CompileChanges(UndoStack):
    """What compile() changed on the model; remove() undoes it (after remove(), train the model
    itself, or compile it again: the compiled module's graphs were traced with the changes)."""

    _pickled_what = "the changes torch_offload.compile made (offload_changes)"

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def sdpa_is_causal(self) -> None:
        switched = hf_causal_mask.switch(self.model)
        if switched is not None:  # None: the model had ours already, nothing of compile()'s to undo
            self.push(switched.remove)

    def detach_logits(self) -> None:
        wrapper = hf_logits.install(self.model)
        if wrapper is not None:
            self.push(functools.partial(_unwrap, self.model, wrapper))

    def hf_checkpointing(self, checkpoint_kwargs: dict) -> None:
        """model.gradient_checkpointing_enable(checkpoint_kwargs) and config.use_cache=False."""
        model = self.model
        previous = [(module, name, module.__dict__.get(name, ABSENT))
                    for module in model.modules() if hasattr(module, "gradient_checkpointing")
                    for name in _HF_MODULE_ATTRIBUTES]
        previous += [(model, name, model.__dict__.get(name, ABSENT)) for name in _HF_MODEL_ATTRIBUTES]
        hooks_before = list(getattr(model, "_require_grads_hooks", None) or ())
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs)
        added = [hook for hook in getattr(model, "_require_grads_hooks", None) or () if hook not in hooks_before]
        self.push(functools.partial(_restore_hf_checkpointing, previous, added))
        if getattr(model, "config", None) is not None:
            self.set_attribute(model.config, "use_cache", False)




def _restore_hf_checkpointing(previous, added_hooks) -> None:
    for hook in added_hooks:
        hook.remove()
    for module, name, value in previous:
        put_back(module, name, value)


def _unwrap(model: nn.Module, wrapper) -> None:
    if model.__dict__.get("forward") is wrapper:  # not replaced since (by the user)
        set_forward(model, wrapper.inner)


def checkpointed(forward, checkpoint_kwargs: dict):
    """`forward` under torch.utils.checkpoint.checkpoint with `checkpoint_kwargs`."""
    def run(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(forward, *args, **checkpoint_kwargs, **kwargs)

    return run
