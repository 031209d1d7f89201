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
position_ids later recompiles (dynamo guards on them being None) and gets the mask. The note is one
per process, set and cleared around each call of the model: a model called from several threads at
once should not use this.

Mechanism: transformers' registries of attention and mask functions (AttentionInterface,
AttentionMaskInterface); the model switches to an implementation registered under our name, which
uses transformers' own SDPA attention with our mask function. Other models are not touched.
"""
import torch

IMPLEMENTATION = "torch_offload_sdpa"
# Call arguments that leave the mask plain causal when given (anything else given: build the mask).
_PLAIN_ARGUMENTS = frozenset({"input_ids", "inputs_embeds", "labels", "use_cache", "return_dict", "logits_to_keep",
                              "num_items_in_batch", "output_attentions", "output_hidden_states"})


class _CallNote:
    """Whether the call of the model being run (or traced) is plain; False outside any call."""

    plain = False


_CALL = _CallNote()


def _note_call(module, args, kwargs):
    given = {name for name, value in kwargs.items() if value is not None}
    _CALL.plain = len(args) <= 1 and given <= _PLAIN_ARGUMENTS


def _end_call(module, args, kwargs, output):
    _CALL.plain = False


def _causal_mask_or_none(*, batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                         attention_mask=None, allow_is_causal_skip=True, **kwargs):
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if mask_function is None:
        mask_function = causal_mask_function
    # transformers' own case (it forbids it while tracing), or a plain call: the model numbered the
    # positions, so the packed-sequence mask transformers adds while tracing is one sequence.
    causal_only = (mask_function is causal_mask_function and allow_is_causal_skip) or (
        _CALL.plain and not kwargs.get("use_vmap", False))
    plain_causal = (causal_only and attention_mask is None and kwargs.get("local_size") is None
                    and q_offset == 0 and kv_offset == 0 and q_length == kv_length)
    if plain_causal:
        return None  # transformers' SDPA attention then passes is_causal=True
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def _register() -> None:
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:
        raise RuntimeError(
            "torch_offload: sdpa_is_causal needs transformers' AttentionInterface and AttentionMaskInterface "
            f"(transformers >= 4.53): {error}") from error
    AttentionInterface.register(IMPLEMENTATION, sdpa_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, _causal_mask_or_none)


def sdpa_is_causal(model: torch.nn.Module) -> str:
    """Switches a Hugging Face model that uses SDPA attention to the same attention without the dense
    causal mask where the mask is plain causal (see the module's doc). Returns the implementation it
    had, to go back with `model.set_attn_implementation(previous)`. Raises ValueError for a model
    that is not a transformers model or does not use "sdpa"."""
    return switch(model)[0]


def switch(model: torch.nn.Module):
    """sdpa_is_causal(model): (the implementation the model had, the hook handles installed), no
    handles where the model had ours already (torch_offload.compile undoes only what it did)."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == IMPLEMENTATION:
        return current, []
    if current != "sdpa" or not hasattr(model, "set_attn_implementation"):
        raise ValueError(
            f"torch_offload: sdpa_is_causal is for a Hugging Face model with attn_implementation='sdpa'; "
            f"{type(model).__name__} has {current!r}")
    _register()
    model.set_attn_implementation(IMPLEMENTATION)
    if config._attn_implementation != IMPLEMENTATION:
        raise RuntimeError(f"torch_offload: {type(model).__name__} did not take the attention implementation "
                           f"{IMPLEMENTATION!r} (it has {config._attn_implementation!r})")
    hooks = [model.register_forward_pre_hook(_note_call, with_kwargs=True),
             model.register_forward_hook(_end_call, with_kwargs=True, always_call=True)]
    return current, hooks
