"""Chunked causal-LM loss (torch_offload/chunked_loss.py, lm_loss.py): the loss and gradients of
Hugging Face's own loss on a tiny Llama (fp32), without ever materialising the logits of the whole
sequence; ignore_index, sequences shorter than a chunk, chunks that do not divide the length,
num_items_in_batch, shift_labels; chunk_lm_loss / apply(chunked_loss=...) and their remove().

Bit for bit where there is one chunk; with several the loss is a sum of chunk sums and the weight's
gradient a sum of per-chunk products (and the products may round a row differently for a chunk than
for the whole sequence), so those are compared within fp32 summation-order tolerance."""
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.loss.loss_utils import ForCausalLMLoss

import torch_offload
from torch_offload.loss.chunked_loss import chunked_causal_lm_loss

VOCAB, SEQ = 320, 40
close = functools.partial(torch.testing.assert_close, rtol=1e-5, atol=1e-6)


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         attn_implementation="sdpa", use_cache=False)
    return LlamaForCausalLM(config).train()


def batch(seq=SEQ):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, seq), generator=g)
    labels = ids.clone()
    labels[0, 5:17] = -100  # a prompt
    labels[1, -3:] = -100  # padding
    return ids, labels


def loss_and_grads(hidden, weight, loss_fn):
    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    loss = loss_fn(hidden, weight)
    return (loss.detach(), *torch.autograd.grad(loss, (hidden, weight)))


def hf_loss(labels, **kwargs):
    return lambda h, w: ForCausalLMLoss(torch.nn.functional.linear(h, w), labels, VOCAB, **kwargs)


def inputs():
    torch.manual_seed(2)
    return torch.randn(2, SEQ, 32), torch.randn(VOCAB, 32) * 0.1


@pytest.mark.parametrize("chunk", [SEQ * 2, 1000, 7, 16, 1])  # whole batch in one chunk, shorter than a chunk, not dividing
def test_loss_and_grads_match_hugging_face(chunk):
    _, labels = batch()
    hidden, weight = inputs()
    reference = loss_and_grads(hidden, weight, hf_loss(labels))
    ours = loss_and_grads(hidden, weight, lambda h, w: chunked_causal_lm_loss(h, w, labels, chunk_tokens=chunk))
    if chunk >= 2 * SEQ:  # one chunk: the same kernels on the same rows
        for a, b in zip(ours, reference):
            assert torch.equal(a, b)
    for a, b in zip(ours, reference):
        close(a, b)


def test_ignored_tokens_get_no_gradient_and_are_not_counted():
    _, labels = batch()
    hidden, weight = inputs()
    loss, grad_hidden, _ = loss_and_grads(hidden, weight, lambda h, w: chunked_causal_lm_loss(h, w, labels, chunk_tokens=8))
    # position i is scored against labels[i + 1]: rows 4..15 of the first sequence and the last 4 of the second
    assert torch.count_nonzero(grad_hidden[0, 4:16]) == 0 and torch.count_nonzero(grad_hidden[1, -4:]) == 0
    assert torch.count_nonzero(grad_hidden[0, :4].abs().sum(-1)) == 4
    everything = torch.full_like(labels, -100)
    everything[:, :2] = labels[:, :2]  # only position 0 of each row is scored: 2 tokens
    per_token = [chunked_causal_lm_loss(hidden[i:i + 1, :1], weight, shift_labels=everything[i:i + 1, 1:2]) for i in range(2)]
    close(chunked_causal_lm_loss(hidden, weight, everything, chunk_tokens=8), sum(per_token) / 2)


def test_num_items_in_batch_and_shift_labels_as_hugging_face():
    _, labels = batch()
    hidden, weight = inputs()
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    for kwargs in (dict(num_items_in_batch=torch.tensor(123)), dict(shift_labels=shifted)):
        reference = loss_and_grads(hidden, weight, hf_loss(None if "shift_labels" in kwargs else labels, **kwargs))
        ours = loss_and_grads(hidden, weight, lambda h, w: chunked_causal_lm_loss(
            h, w, None if "shift_labels" in kwargs else labels, chunk_tokens=7, **kwargs))
        for a, b in zip(ours, reference):
            close(a, b)


def test_bad_arguments_are_named():
    hidden, weight = inputs()
    with pytest.raises(ValueError, match="chunk_tokens=0"):
        chunked_causal_lm_loss(hidden, weight, batch()[1], chunk_tokens=0)
    with pytest.raises(ValueError, match="labels or shift_labels"):
        chunked_causal_lm_loss(hidden, weight)
    with pytest.raises(ValueError, match="80 hidden-state rows but 78 labels"):
        chunked_causal_lm_loss(hidden, weight, batch()[1][:, :-1])


class LargestOutput(TorchDispatchMode):
    """The most elements any op produced: the full logits are batch x SEQ x VOCAB."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def train_step(model, ids, labels, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kwargs)
    out.loss.backward()
    return out, {name: p.grad for name, p in model.named_parameters()}


def test_chunk_lm_loss_on_a_llama_matches_its_own_loss_and_never_holds_the_logits():
    ids, labels = batch()
    reference, ours = tiny_llama(), tiny_llama()
    with LargestOutput() as reference_sizes:
        out_ref, grads_ref = train_step(reference, ids, labels)
    handle = torch_offload.chunk_lm_loss(ours, chunk_tokens=16)
    with LargestOutput() as sizes:
        out, grads = train_step(ours, ids, labels)
    assert out.logits is None
    close(out.loss, out_ref.loss)
    assert grads.keys() == grads_ref.keys()
    for name in grads_ref:
        close(grads[name], grads_ref[name], msg=lambda m: f"{name}: {m}")
    # Hugging Face's loss makes the logits of every token (and their upcast, gradients); ours at
    # most one chunk's (16 x VOCAB) or the weight's size (VOCAB x 32) at a time
    assert reference_sizes.largest == 2 * SEQ * VOCAB
    assert sizes.largest == max(16, 32) * VOCAB
    # num_items_in_batch (what Trainer passes with gradient accumulation) reaches the chunked loss
    out_ref, _ = train_step(reference, ids, labels, num_items_in_batch=torch.tensor(50))
    out, _ = train_step(ours, ids, labels, num_items_in_batch=torch.tensor(50))
    close(out.loss, out_ref.loss)
    # without labels, in eval mode, or without grad: the model's own logits
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, reference(input_ids=ids).logits)
        assert torch.equal(ours(input_ids=ids, labels=labels).logits, reference(input_ids=ids, labels=labels).logits)
    ours.eval()
    assert ours(input_ids=ids, labels=labels).logits is not None
    handle.remove()


def test_remove_restores_the_original_forward_and_loss():
    ids, labels = batch()
    model = tiny_llama()
    head = model.lm_head
    originals = (model.__dict__.get("forward"), head.__dict__.get("forward"), model.loss_function)
    handle = torch_offload.chunk_lm_loss(model)
    with pytest.raises(ValueError, match="chunked already"):
        torch_offload.chunk_lm_loss(model)
    handle.remove()
    assert (model.__dict__.get("forward"), head.__dict__.get("forward"), model.loss_function) == originals
    assert "_loss_function" not in model.__dict__
    out, _ = train_step(model, ids, labels)
    assert out.logits.shape == (2, SEQ, VOCAB)
    torch_offload.chunk_lm_loss(model).remove()  # can be applied again


def test_apply_hidden_states_with_chunked_loss_matches_checkpointing():
    ids, labels = batch()
    reference, ours = tiny_llama(), tiny_llama()
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = torch_offload.apply(ours, "hidden_states", chunked_loss=16)
    assert handle.chunked_loss.chunk_tokens == 16
    out_ref, grads_ref = train_step(reference, ids, labels)
    out, grads = train_step(ours, ids, labels)
    assert out.logits is None and handle.stats()["bytes_to_host"] > 0
    close(out.loss, out_ref.loss)
    for name in grads_ref:
        close(grads[name], grads_ref[name], msg=lambda m: f"{name}: {m}")
    handle.remove()
    assert handle.chunked_loss is None and "forward" not in ours.__dict__
    assert train_step(ours, ids, labels)[0].logits is not None


def test_models_it_cannot_serve_are_refused_by_name():
    with pytest.raises(TypeError, match="Sequential has no nn.Linear LM head"):
        torch_offload.chunk_lm_loss(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    model = tiny_llama()
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping=30.0"):
        torch_offload.apply(model, "hidden_states", chunked_loss=True)
    assert "forward" not in model.__dict__
    with pytest.raises(ValueError, match="chunk_tokens=0"):
        torch_offload.apply(tiny_llama(), "hidden_states", chunked_loss=0)


def test_deepcopy_of_a_chunked_model_is_chunked_on_its_own_weights():
    import copy

    ids, labels = batch()
    model = tiny_llama()
    handle = torch_offload.apply(model, "hidden_states", chunked_loss=8)
    copied, copied_handle = copy.deepcopy((model, handle))
    with torch.no_grad():
        copied.lm_head.weight.mul_(2)  # the copy's loss must use the copy's LM head
    out, out_copy = model(input_ids=ids, labels=labels), copied(input_ids=ids, labels=labels)
    assert out.logits is None and out_copy.logits is None and not torch.equal(out.loss, out_copy.loss)
    copied_handle.remove()
    assert copied(input_ids=ids, labels=labels).logits is not None
    assert model(input_ids=ids, labels=labels).logits is None  # the original stays chunked


@pytest.mark.parametrize("num_items", [None, 50])
def test_gradients_computed_in_forward_are_those_of_the_chunked_backward(num_items):
    # loss.backward() (an incoming gradient of 1): bit for bit what the chunked backward gives.
    _, labels = batch()
    hidden, weight = inputs()
    kwargs = dict(chunk_tokens=16, num_items_in_batch=num_items)
    chunked = loss_and_grads(hidden, weight, lambda h, w: chunked_causal_lm_loss(h, w, labels, **kwargs))
    in_forward = loss_and_grads(
        hidden, weight, lambda h, w: chunked_causal_lm_loss(h, w, labels, grads_in_forward=True, **kwargs))
    for a, b in zip(in_forward, chunked):
        assert torch.equal(a, b)


def test_gradients_computed_in_forward_follow_the_incoming_gradient_and_one_backward():
    _, labels = batch()
    hidden, weight = inputs()
    reference = loss_and_grads(hidden, weight, lambda h, w: 3 * chunked_causal_lm_loss(h, w, labels, chunk_tokens=16))
    ours = loss_and_grads(
        hidden, weight, lambda h, w: 3 * chunked_causal_lm_loss(h, w, labels, chunk_tokens=16, grads_in_forward=True))
    for a, b in zip(ours, reference):
        close(a, b)
    # A frozen weight gets no gradient computed; a second backward through one forward is an error.
    h = hidden.detach().requires_grad_()
    loss = chunked_causal_lm_loss(h, weight, labels, chunk_tokens=16, grads_in_forward=True)
    loss.backward(retain_graph=True)
    assert weight.grad is None and h.grad is not None
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_chunk_lm_loss_with_gradients_in_forward_trains_a_llama_like_its_own_loss():
    ids, labels = batch()
    reference, ours, chunked = tiny_llama(), tiny_llama(), tiny_llama()
    torch_offload.chunk_lm_loss(chunked, chunk_tokens=16, grads_in_forward=False)
    handle = torch_offload.chunk_lm_loss(ours, chunk_tokens=16)  # gradients in the forward: the default
    assert handle.grads_in_forward
    out_ref, grads_ref = train_step(reference, ids, labels)
    out_chunked, grads_chunked = train_step(chunked, ids, labels)
    out, grads = train_step(ours, ids, labels)
    assert out.logits is None and torch.equal(out.loss, out_chunked.loss)
    close(out.loss, out_ref.loss)
    for name in grads_ref:
        assert torch.equal(grads[name], grads_chunked[name]), name
        close(grads[name], grads_ref[name], msg=lambda m: f"{name}: {m}")
    with pytest.raises(ValueError, match="grads_in_forward=1"):
        torch_offload.chunk_lm_loss(tiny_llama(), grads_in_forward=1)
    handle.remove()


@pytest.mark.parametrize("grads_in_forward", [True, False])
@pytest.mark.parametrize("chunk", [SEQ * 2, 16])
def test_under_autocast_the_products_run_in_its_dtype_as_the_models_own_loss(grads_in_forward, chunk):
    # Mixed precision with float32 weights (a Trainer's bf16=True): autocast casts the LM head's
    # operands to bf16 in the forward, and its backward computes the products' gradients in bf16
    # too, cast back to the weights' dtype. Both the forward's gradients and the backward's follow it;
    # with one chunk (the batch's 80 rows) they are the model's own, bit for bit.
    ids, labels = batch()
    reference, ours = tiny_llama(), tiny_llama()
    torch_offload.chunk_lm_loss(ours, chunk_tokens=chunk, grads_in_forward=grads_in_forward)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_ref = reference(input_ids=ids, labels=labels)
        out = ours(input_ids=ids, labels=labels)
    out_ref.loss.backward()
    out.loss.backward()
    assert out.logits is None and reference.lm_head.weight.grad.dtype == torch.float32
    for (name, a), (_, b) in zip(ours.named_parameters(), reference.named_parameters()):
        assert a.grad.dtype == b.grad.dtype == torch.float32, name
        if chunk >= 2 * SEQ:
            assert torch.equal(a.grad, b.grad), name
        else:  # per-chunk bf16 products summed in float32 against one bf16 product
            torch.testing.assert_close(a.grad, b.grad, rtol=2e-2, atol=1e-3, msg=lambda m: f"{name}: {m}")
    if chunk >= 2 * SEQ:
        assert torch.equal(out.loss, out_ref.loss)
    else:
        close(out.loss, out_ref.loss)


def test_apply_passes_a_dict_of_chunk_lm_loss_keywords():
    # apply(chunked_loss={"grads_in_forward": True}) is chunk_lm_loss(grads_in_forward=True) under a
    # checkpointing mode: the same gradients as checkpointing with the model's own loss.
    ids, labels = batch()
    reference, ours = tiny_llama(), tiny_llama()
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = torch_offload.apply(ours, "hidden_states", chunked_loss={"chunk_tokens": 16, "grads_in_forward": True})
    assert handle.chunked_loss.chunk_tokens == 16 and handle.chunked_loss.grads_in_forward
    out_ref, grads_ref = train_step(reference, ids, labels)
    out, grads = train_step(ours, ids, labels)
    assert out.logits is None
    close(out.loss, out_ref.loss)
    for name in grads_ref:
        close(grads[name], grads_ref[name], msg=lambda m: f"{name}: {m}")
    handle.remove()
    with pytest.raises(TypeError, match=r"unknown keys \['grads_in_fwd'\]"):
        torch_offload.apply(tiny_llama(), "hidden_states", chunked_loss={"grads_in_fwd": True})
    with pytest.raises(ValueError, match="chunked_loss='yes'"):
        torch_offload.apply(tiny_llama(), "hidden_states", chunked_loss="yes")
    model = tiny_llama()
    with pytest.raises(ValueError, match="grads_in_forward=1"):
        torch_offload.apply(model, "hidden_states", chunked_loss={"grads_in_forward": 1})
    assert "forward" not in model.__dict__  # nothing left behind


def test_a_peft_model_as_users_hold_it_takes_the_chunked_loss():
    """apply(peft_model, chunked_loss=True) and chunk_lm_loss(peft_model): the base model's loss is
    chunked, the PeftModel's forward reaches it; the adapters train as with the model's own loss."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    ids, labels = batch()

    def train(chunked):
        model = peft.get_peft_model(tiny_llama(), config)
        handle = torch_offload.apply(model, "hidden_states", chunked_loss=chunked) if chunked else None
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        return model, handle, out, grads

    _, _, reference, reference_grads = train(False)
    model, handle, out, grads = train(16)
    assert out.logits is None  # the chunked loss ran
    close(out.loss, reference.loss)
    assert grads.keys() == reference_grads.keys() and all("lora_" in n for n in grads)
    for name, grad in grads.items():
        close(grad, reference_grads[name])
    handle.remove()
    assert model(input_ids=ids, labels=labels).logits is not None
    handle = torch_offload.chunk_lm_loss(model, 16)
    assert model(input_ids=ids, labels=labels).logits is None
    handle.remove()


@pytest.mark.parametrize("grads_in_forward", [True, False])
def test_a_compiled_model_trains_with_the_chunked_loss_as_the_eager_one(grads_in_forward):
    ids, labels = batch()
    eager, compiled = tiny_llama(), tiny_llama()
    torch_offload.chunk_lm_loss(eager, chunk_tokens=16, grads_in_forward=grads_in_forward)
    torch_offload.chunk_lm_loss(compiled, chunk_tokens=16, grads_in_forward=grads_in_forward)
    torch._dynamo.reset()
    out_eager, grads_eager = train_step(eager, ids, labels)
    out, _ = train_step(torch.compile(compiled), ids, labels)
    grads = {name: p.grad for name, p in compiled.named_parameters()}
    assert out.logits is None
    close(out.loss, out_eager.loss)
    for name in grads_eager:
        close(grads[name], grads_eager[name], msg=lambda m: f"{name}: {m}")
