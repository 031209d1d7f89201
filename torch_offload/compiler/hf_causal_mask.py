"""sdpa_is_causal(): a Hugging Face model with SDPA attention, compiled, without the dense causal mask.

Under torch.compile, transformers builds the full [batch, 1, S, S] causal mask even when the model is
called without an attention_mask and without a cache: its "use SDPA's is_causal instead" shortcut
refuses to run while tracing (the shortcut is data-dependent for torch.export, which bakes it into the
exported graph). The mask costs S*S bytes or more (0.54 GB at 16k and 8.6 GB at 64k on the reference
model) and sends SDPA to its biased kernel instead of the causal flash / cuDNN one, so compiled
training runs well below eager's speed (docs/performance.md, "torch.compile").

Here the decision is made from what dynamo guards anyway. A forward pre-hook on the model notes
whether the call is plain: no attention_mask (None, not a tensor of ones: that would need the data),
no position_ids, no cache, nothing else that shapes the mask; the model then numbers the positions
itself, so there are no packed sequences (which transformers must otherwise assume while tracing,
as it cannot read position_ids). For such a call, a mask with as many keys as queries, no offset and
no window or extra mask function is plain causal: our mask function returns None and transformers'
SDPA attention calls SDPA with is_causal=True, the same mask applied by the kernel. Every other call
builds the mask as transformers does; calling the compiled model with an attention_mask or
position_ids later recompiles (dynamo guards on them being None) and gets the mask. The note belongs
to the model's switch (one per switched model, found from the config transformers hands the mask
function), set and cleared around each call of the model: one model called from several threads at
once should not use this.

Mechanism: transformers' registries of attention and mask functions (AttentionInterface,
AttentionMaskInterface), where a model looks up its implementation by name: the model switches to an
implementation registered under our name, which uses transformers' own SDPA attention with our mask
function. transformers 5.17 offers no per-model registry (the mask lookup reads the registry of the
class itself), so our name is registered while at least one model is switched to it, and taken out
again when the last one is switched back: by remove() of what sdpa_is_causal returned, of
torch_offload.compile's offload_changes, or when the model is freed. Other models are not touched.
"""
import copy
import weakref

import torch

from ..copy_and_pickle import NotPicklable

IMPLEMENTATION = "torch_offload_sdpa"
# Call arguments that leave the mask plain causal when given (anything else given: build the mask).
_PLAIN_ARGUMENTS = frozenset({"input_ids", "inputs_embeds", "labels", "use_cache", "return_dict", "logits_to_keep",
                              "num_items_in_batch", "output_attentions", "output_hidden_states"})

_switches = {}  # id(config) -> the _Switch of the switched model that config belongs to


def _causal_mask_or_none(*, batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                         attention_mask=None, allow_is_causal_skip=True, **kwargs):
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if mask_function is None:
        mask_function = causal_mask_function
    switch = _switches.get(id(kwargs.get("config")))
    plain_call = switch is not None and switch.plain
    # transformers' own case (it forbids it while tracing), or a plain call: the model numbered the
    # positions, so the packed-sequence mask transformers adds while tracing is one sequence.
    causal_only = (mask_function is causal_mask_function and allow_is_causal_skip) or (
        plain_call and not kwargs.get("use_vmap", False))
    plain_causal = (causal_only and attention_mask is None and kwargs.get("local_size") is None
                    and q_offset == 0 and kv_offset == 0 and q_length == kv_length)
    if plain_causal:
        return None  # transformers' SDPA attention then passes is_causal=True
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)


class _Registration:
    """Our name in transformers' two registries, while `users` switched models need it; what the name
    held before (nothing, normally) is put back when the last one goes."""

    def __init__(self):
        self.users = 0
        self.previous = {}  # registry class -> what it held under our name, or _ABSENT

    def acquire(self) -> None:
        if self.users == 0:
            for registry, function in _registries():
                self.previous[registry] = registry._global_mapping.get(IMPLEMENTATION, _ABSENT)
                registry.register(IMPLEMENTATION, function)
        self.users += 1

    def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            # transformers has no unregister: register() writes the class's _global_mapping, which
            # the mask lookup reads directly.
            for registry, previous in self.previous.items():
                if previous is _ABSENT:
                    registry._global_mapping.pop(IMPLEMENTATION, None)
                else:
                    registry._global_mapping[IMPLEMENTATION] = previous
            self.previous.clear()


_ABSENT = object()
_registration = _Registration()


def _registries():
    """(registry class, our function) for transformers' attention and mask registries."""
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:
        raise RuntimeError(
            "torch_offload: sdpa_is_causal needs transformers' AttentionInterface and AttentionMaskInterface "
            f"(transformers >= 4.53): {error}") from error
    return ((AttentionInterface, sdpa_attention_forward), (AttentionMaskInterface, _causal_mask_or_none))


def _configs(model: torch.nn.Module) -> list:
    """The configs of `model` and of its submodels (a multimodal model's text model has its own),
    each once: the mask function is handed one of them."""
    found = {}
    for module in (model, *model.modules()):
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            found.setdefault(id(config), config)
    return list(found.values())


def _release(config_ids) -> None:
    for config_id in config_ids:
        _switches.pop(config_id, None)
    _registration.release()


class _Switch(NotPicklable):
    """One model switched to our implementation: the note of whether its call being run is plain,
    the hooks that keep it, and what remove() puts back. Our registration is held until remove(), or
    until the model's config is freed."""

    _pickled_what = "the switch of torch_offload.sdpa_is_causal (a forward hook of the model)"

    def __init__(self, configs, previous: str):
        self.previous, self.plain, self.model, self.hooks = str(previous), False, None, []
        self.configs = [weakref.ref(config) for config in configs]
        config_ids = tuple(id(config) for config in configs)
        for config_id in config_ids:
            _switches[config_id] = self
        _registration.acquire()
        self._release = weakref.finalize(configs[0], _release, config_ids)
        self._release.atexit = False  # at exit transformers' registries go with the process

    def note_call(self, module, args, kwargs):
        given = {name for name, value in kwargs.items() if value is not None}
        self.plain = len(args) <= 1 and given <= _PLAIN_ARGUMENTS

    def end_call(self, module, args, kwargs, output):
        self.plain = False

    def remove(self) -> None:
        """The hooks removed, the model's previous implementation back (if it still has ours) and our
        registration released. Idempotent."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        model = self.model() if self.model is not None else None
        if model is not None and getattr(model.config, "_attn_implementation", None) == IMPLEMENTATION:
            model.set_attn_implementation(self.previous)
        self._release()

    def __deepcopy__(self, memo):
        # A deep copy of the model (EMA, teacher) copies its hooks, bound to this: the copy gets a
        # switch of its own, for its own configs, holding our registration while it lives.
        configs = [copy.deepcopy(ref(), memo) for ref in self.configs if ref() is not None]
        switched = _Switch(configs, self.previous)
        memo[id(self)] = switched
        return switched


class PreviousImplementation(str):
    """What sdpa_is_causal returns: the attention implementation the model had (a str, as
    model.set_attn_implementation takes it), and remove(), which puts it back and takes out what
    sdpa_is_causal installed (its hooks, and our name from transformers' registries once no model
    uses it)."""

    def __new__(cls, previous: str, switch=None):
        answer = super().__new__(cls, previous)
        answer._switch = switch
        return answer

    def remove(self) -> None:
        """Idempotent; nothing to do where the model had our implementation already."""
        if self._switch is not None:
            self._switch.remove()

    def __reduce__(self):  # copied or pickled (a config that holds it): the name alone
        return str, (str(self),)


def sdpa_is_causal(model: torch.nn.Module) -> str:
    """Switches a Hugging Face model that uses SDPA attention to the same attention without the dense
    causal mask where the mask is plain causal (see the module's doc). Returns the implementation it
    had (a str: `model.set_attn_implementation(previous)` goes back to it), whose remove() also takes
    out the hooks and, once no model uses it, our name from transformers' registries. Raises
    ValueError for a model that is not a transformers model or does not use "sdpa"."""
    config = getattr(model, "config", None)
    switched = switch(model)
    return PreviousImplementation(switched.previous if switched is not None else config._attn_implementation,
                                  switched)


def switch(model: torch.nn.Module):
    """sdpa_is_causal(model): the model's _Switch (switched.remove() undoes it), or None where the
    model had ours already (torch_offload.compile undoes only what it did)."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == IMPLEMENTATION:
        return None
    if current != "sdpa" or not hasattr(model, "set_attn_implementation"):
        raise ValueError(
            f"torch_offload: sdpa_is_causal is for a Hugging Face model with attn_implementation='sdpa'; "
            f"{type(model).__name__} has {current!r}")
    switched = _Switch(_configs(model), current)
    try:
        model.set_attn_implementation(IMPLEMENTATION)
        if config._attn_implementation != IMPLEMENTATION:
            raise RuntimeError(f"torch_offload: {type(model).__name__} did not take the attention implementation "
                               f"{IMPLEMENTATION!r} (it has {config._attn_implementation!r})")
    except BaseException:
        switched.remove()
        raise
    switched.model = weakref.ref(model)
    switched.hooks = [model.register_forward_pre_hook(switched.note_call, with_kwargs=True),
                      model.register_forward_hook(switched.end_call, with_kwargs=True, always_call=True)]
    return switched
