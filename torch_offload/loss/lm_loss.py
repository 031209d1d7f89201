"""chunk_lm_loss(model): a Hugging Face causal LM computes its training loss with
chunked_causal_lm_loss (chunked_loss.py) instead of materialising the logits of the whole sequence.

How, without copying the model's forward: while the model trains (training mode, grad enabled) and
is called with `labels` (or `shift_labels`), its LM head returns the chunked loss computed from the
hidden states and its own weight, and the model's loss function passes that value through. So the
loss is computed inside the LM head's forward, where FSDP2 has gathered its weight (whether
fully_shard wraps the LM head or only the root), and the loss is the LM head's output, on which
FSDP2 hangs its pre-backward gather. What the model adds to the loss afterwards (an MoE router's
auxiliary loss) is added as before. The returned output has `logits=None`.
"""
from torch import nn

from ..blocks import ForwardWrapper
from .chunked_loss import DEFAULT_CHUNK_TOKENS, chunked_causal_lm_loss
from ..copy_and_pickle import NotPicklable
from ..undo import UndoStack

_WRAPPED = "_torch_offload_chunked_loss"  # marks a model whose loss is chunked


class _Pending(NotPicklable):
    """The labels of the model call in progress, for the LM head; None outside such a call."""

    _pickled_what = "its chunked loss state"

    def __init__(self):
        self.call = None


class _ModelForward(ForwardWrapper):
    """The causal LM's forward: hands the labels to the LM head, returns logits=None."""

    def __init__(self, model: nn.Module, pending: _Pending, chunk_tokens: int):
        super().__init__(model)
        self.pending, self.chunk_tokens = pending, chunk_tokens

    def __call__(self, *args, **kwargs):
        labels, shift_labels = kwargs.get("labels"), kwargs.get("shift_labels")
        if (labels is None and shift_labels is None) or not self.training_with_grad():
            return self.run(*args, **kwargs)
        if self.pending.call is not None:
            raise RuntimeError("torch_offload.chunk_lm_loss: the model was called again from inside its own forward")
        self.pending.call = dict(labels=labels, shift_labels=shift_labels,
                                 num_items_in_batch=kwargs.get("num_items_in_batch"),
                                 ignore_index=kwargs.get("ignore_index", -100), loss=None)
        try:
            output = self.run(*args, **kwargs)
            computed = self.pending.call["loss"] is not None
        finally:
            self.pending.call = None
        if not computed:
            raise RuntimeError(f"torch_offload.chunk_lm_loss: {type(self.block).__name__}'s forward did not "
                               "call its LM head (output embeddings) with the hidden states")
        output.logits = None
        return output


class _HeadForward(ForwardWrapper):
    """The LM head's forward: during a call with labels, the chunked loss instead of the logits."""

    def __init__(self, head: nn.Module, pending: _Pending, chunk_tokens: int, grads_in_forward: bool):
        super().__init__(head)
        self.pending, self.chunk_tokens, self.grads_in_forward = pending, chunk_tokens, grads_in_forward

    def __call__(self, hidden, *args, **kwargs):
        call = self.pending.call
        if call is None or call["loss"] is not None:
            return self.run(hidden, *args, **kwargs)
        tokens = (call["labels"] if call["shift_labels"] is None else call["shift_labels"]).shape[-1]
        if hidden.shape[-2] != tokens:
            raise ValueError(f"torch_offload.chunk_lm_loss: the LM head got {hidden.shape[-2]} positions for "
                             f"{tokens} labels (logits_to_keep must be 0 when training with labels)")
        loss = chunked_causal_lm_loss(hidden, self.block.weight, call["labels"], bias=self.block.bias,
                                      chunk_tokens=self.chunk_tokens, ignore_index=call["ignore_index"],
                                      num_items_in_batch=call["num_items_in_batch"],
                                      shift_labels=call["shift_labels"], grads_in_forward=self.grads_in_forward)
        call["loss"] = loss
        return loss


class _PassLoss(NotPicklable):
    """The model's loss function while chunked: the LM head's output already is the loss."""

    _pickled_what = "its chunked loss function"

    def __init__(self, pending: _Pending, original):
        self.pending, self.original = pending, original

    def __call__(self, logits, labels, *args, **kwargs):
        call = self.pending.call
        if call is not None and logits is call["loss"]:
            return logits
        return self.original(logits, labels, *args, **kwargs)


class ChunkedLossHandle(UndoStack):
    """What chunk_lm_loss() returns; remove() gives the model its own loss and logits back."""

    _pickled_what = "its ChunkedLossHandle"

    def __init__(self, model: nn.Module, head: nn.Module, chunk_tokens: int, grads_in_forward: bool):
        super().__init__()
        self.model, self.head, self.chunk_tokens = model, head, chunk_tokens
        self.grads_in_forward = grads_in_forward
        pending = _Pending()
        self.replace_forward(model, _ModelForward(model, pending, chunk_tokens))
        self.replace_forward(head, _HeadForward(head, pending, chunk_tokens, grads_in_forward))
        # The model's loss_function property reads and writes its `_loss_function`.
        self.set_attribute(model, "_loss_function", _PassLoss(pending, model.loss_function))
        self.set_attribute(model, _WRAPPED, True)


def _causal_lm(model: nn.Module) -> nn.Module:
    """The Hugging Face model whose loss to chunk: a PEFT model's base model (PeftModel calls its
    forward, whose wrapper then serves both), else `model`."""
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base) and not hasattr(type(model), "loss_function"):
        base = get_base()
        if isinstance(base, nn.Module) and base is not model:
            return base
    return model


def _not_causal_lm(model: nn.Module):
    """Why `model`'s loss is not the causal LM loss chunked_causal_lm_loss computes (the mean cross
    entropy of the head's output over the labels shifted by one), or None. Told by what the model
    itself computes: an encoder-decoder model's decoder is fed the labels shifted already and its
    loss compares them unshifted (T5, BART, Whisper); other models compute the loss transformers
    picks from the class name (PreTrainedModel.loss_type: "ForCausalLM", a vision-language
    "ForConditionalGeneration" and an unmatched name get ForCausalLMLoss; "ForMaskedLM" and the
    classification heads do not)."""
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return ("an encoder-decoder model (config.is_encoder_decoder=True): its decoder's loss compares unshifted "
                "labels")
    loss_type = getattr(model, "loss_type", None)
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING
    except ImportError:  # an older transformers without the mapping: nothing more to tell by
        return None
    causal = LOSS_MAPPING.get("ForCausalLM")
    if loss_type is not None and LOSS_MAPPING.get(loss_type, causal) is not causal:
        return f"its loss is transformers' {loss_type} loss (loss_type={loss_type!r}), not the causal LM loss"
    return None


def chunked_lm_loss_target(model: nn.Module, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                           grads_in_forward: bool = True):
    """(the Hugging Face causal LM whose loss chunk_lm_loss chunks, its LM head), after checking that
    it can: raises TypeError / ValueError saying why not. Changes nothing."""
    model = _causal_lm(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear):
        raise TypeError(f"torch_offload.chunk_lm_loss: {type(model).__name__} has no nn.Linear LM head "
                        f"(get_output_embeddings() gave {type(head).__name__}); it needs a Hugging Face causal LM")
    if not hasattr(type(model), "loss_function"):
        raise TypeError(f"torch_offload.chunk_lm_loss: {type(model).__name__} has no loss_function "
                        "(a Hugging Face PreTrainedModel's): nothing to chunk")
    why = _not_causal_lm(model)
    if why is not None:
        raise TypeError(f"torch_offload.chunk_lm_loss: {type(model).__name__} is not a causal LM: {why}. The chunked "
                        "loss computes a causal LM's loss (labels shifted by one token); train this model with its "
                        "own loss (no chunked_loss=)")
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, name, None) not in (None, 1, 1.0):
            raise ValueError(f"torch_offload.chunk_lm_loss: {type(model).__name__} transforms its logits "
                             f"(config.{name}={getattr(config, name)}) before the loss; not supported")
    if not isinstance(chunk_tokens, int) or isinstance(chunk_tokens, bool) or chunk_tokens < 1:
        raise ValueError(f"torch_offload.chunk_lm_loss: chunk_tokens={chunk_tokens!r}; expected a positive int")
    if model.__dict__.get(_WRAPPED):
        raise ValueError("torch_offload.chunk_lm_loss: the model's loss is chunked already; call remove() first")
    if not isinstance(grads_in_forward, bool):
        raise ValueError(f"torch_offload.chunk_lm_loss: grads_in_forward={grads_in_forward!r}; expected True or False")
    return model, head


def chunk_lm_loss(model: nn.Module, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, *,
                  grads_in_forward: bool = True) -> ChunkedLossHandle:
    """Makes a Hugging Face causal LM compute its training loss chunk_tokens tokens at a time
    (chunked_causal_lm_loss): called with `labels` in training mode with grad enabled, it returns the
    same loss (fp32 mean cross-entropy over the shifted labels that are not ignore_index, or divided
    by num_items_in_batch) with `logits=None`; in evaluation, without grad or without labels it runs
    unchanged. Works before or after FSDP2's fully_shard, and on a PEFT model as users hold it (its base
    model's loss is chunked). Returns a handle; remove() undoes it. A model whose own loss is not the
    causal LM's (a masked LM, an encoder-decoder model) is a TypeError saying why (_not_causal_lm).
    grads_in_forward (default): the loss's gradients are computed in the forward, as a fused linear
    cross-entropy does (no second pass over the logits in backward); one backward per forward, so
    False for retain_graph or a second backward: see chunked_loss.py."""
    model, head = chunked_lm_loss_target(model, chunk_tokens, grads_in_forward)
    return ChunkedLossHandle(model, head, chunk_tokens, grads_in_forward)
