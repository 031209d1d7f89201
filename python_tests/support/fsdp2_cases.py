"""What each gloo rank runs for test_fsdp2.py: a tiny Llama sharded with FSDP2 (fully_shard on every
decoder layer and the root) trained with each torch_offload mode, applied before or after
fully_shard, against the same model under plain FSDP2 (with torch's gradient checkpointing for
hidden_states, whose recompute ours replaces). Losses and gradients (full_tensor() of each
gradient) must be bit-equal in fp32; with the chunked loss (alone or with hidden_states; the LM head
in the root's unit or in its own) equal within fp32 summation-order tolerance.

Each case returns "ok" or the error it met; comparisons run only after every collective of the
case, so that a rank whose check fails does not leave the other waiting in a collective.
"""
import traceback

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

import torch_offload

MODES = ("hidden_states", "hidden_states_reentrant", "all", "sync", "modules")
ORDERS = ("before", "after")  # apply() before or after fully_shard
CHUNKED_MODES = ("chunked_loss", "hidden_states+chunked_loss")


def tiny_llama(dropout=0.1):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, attention_dropout=dropout,
                         max_position_embeddings=128, attn_implementation="sdpa", use_cache=False)
    return LlamaForCausalLM(config).train()


def shard(model, *, nested=False, head_unit=False, **fsdp_options):
    """fully_shard on every decoder layer (and, nested, on its attention and MLP first), with
    head_unit on the LM head, and on the root."""
    if head_unit:  # its own unit: gathered for its forward only, resharded right after
        fully_shard(model.lm_head, **fsdp_options)
    for layer in model.model.layers:
        if nested:
            fully_shard(layer.self_attn, **fsdp_options)
            fully_shard(layer.mlp, **fsdp_options)
        fully_shard(layer, **fsdp_options)
    fully_shard(model, **fsdp_options)
    return model


def apply_mode(model, mode):
    if mode == "chunked_loss":
        return torch_offload.chunk_lm_loss(model, chunk_tokens=24)  # 64 tokens per rank: 3 chunks
    if mode == "hidden_states+chunked_loss":
        return torch_offload.apply(model, mode="hidden_states", chunked_loss=24)
    if mode == "hidden_states":
        return torch_offload.apply(model, mode=mode)
    if mode == "hidden_states_reentrant":  # our reentrant checkpoint: FSDP2 unshards again in its recompute
        return torch_offload.apply(model, mode="hidden_states", use_reentrant=True)
    if mode == "modules":
        return torch_offload.apply(model, mode=mode, targets=["*.self_attn", "*.mlp"], min_bytes=0)
    return torch_offload.apply(model, mode=mode, min_bytes=0)


def _step(model, ids):
    torch.manual_seed(99)  # the same dropout masks in both models
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach()


def _full_grads(model):
    return {name: p.grad.full_tensor() for name, p in model.named_parameters() if p.grad is not None}


def train_both(mode, order, rank, steps=2, **fsdp_options):
    """Trains ours and plain FSDP2 side by side; returns per step (loss ours, loss plain, full
    gradients ours, full gradients plain) and the offloading handle."""
    ours, plain = tiny_llama(), tiny_llama()
    if mode.startswith("hidden_states"):
        plain.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if order == "before":
        handle = apply_mode(ours, mode)
        shard(ours, **fsdp_options)
    else:
        shard(ours, **fsdp_options)
        handle = apply_mode(ours, mode)
    shard(plain, **fsdp_options)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(rank))  # per-rank data
    results = []
    for _ in range(steps):
        for model in (ours, plain):
            model.zero_grad(set_to_none=True)
        loss_ours, loss_plain = _step(ours, ids), _step(plain, ids)
        results.append((loss_ours, loss_plain, _full_grads(ours), _full_grads(plain)))
    return results, handle


def check_chunked(results, handle):
    """Chunked loss: equal to plain FSDP2 within fp32 summation-order tolerance (chunked_loss.py)."""
    for step, (loss_ours, loss_plain, grads_ours, grads_plain) in enumerate(results):
        assert grads_plain and grads_ours.keys() == grads_plain.keys(), (step, sorted(grads_ours))
        for name, a, b in [("loss", loss_ours, loss_plain)] + [
                (name, grads_ours[name], grads_plain[name]) for name in grads_plain]:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step} {name}: {m}")


def check(results, handle, exact=True):
    for step, (loss_ours, loss_plain, grads_ours, grads_plain) in enumerate(results):
        assert grads_plain and grads_ours.keys() == grads_plain.keys(), (step, sorted(grads_ours))
        pairs = [("loss", loss_ours, loss_plain)] + [
            (name, grads_ours[name], grads_plain[name]) for name in grads_plain]
        for name, a, b in pairs:
            if exact:
                assert torch.equal(a, b), f"step {step} {name}: max diff {(a - b).abs().max()}"
            else:  # bf16 compute: within a few bf16 ulps
                torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3,
                                           msg=lambda m: f"step {step} {name}: {m}")
    assert handle.stats()["bytes_to_host"] > 0, "nothing was offloaded"


def _run(case):
    try:
        case()
        return "ok"
    except Exception:
        return traceback.format_exc(limit=6)


def run_all(rank, world_size, selected=None):
    """Every case (or the names in `selected`), by name: "ok" or the error."""
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    cases = {}
    for mode in MODES:
        for order in ORDERS:
            cases[f"{mode}-{order}"] = lambda m=mode, o=order: check(*train_both(m, o, rank))
            cases[f"{mode}-{order}-no_reshard"] = lambda m=mode, o=order: check(
                *train_both(m, o, rank, reshard_after_forward=False))
            cases[f"{mode}-{order}-nested"] = lambda m=mode, o=order: check(
                *train_both(m, o, rank, nested=True))
        cases[f"{mode}-after-bf16"] = lambda m=mode: check(
            *train_both(m, "after", rank, mp_policy=mixed), exact=False)
        # FSDP2's own parameter offload (sharded parameters in host memory) together with ours.
        cases[f"{mode}-after-cpu_offload"] = lambda m=mode: check(
            *train_both(m, "after", rank, offload_policy=CPUOffloadPolicy(pin_memory=False)))
    for order in ORDERS:
        for mode in CHUNKED_MODES:
            cases[f"{mode}-{order}"] = lambda m=mode, o=order: check_chunked(*train_both(m, o, rank))
            cases[f"{mode}-{order}-head_unit"] = lambda m=mode, o=order: check_chunked(
                *train_both(m, o, rank, head_unit=True))
    names = selected if selected is not None else list(cases)
    return {name: _run(cases[name]) for name in names}
