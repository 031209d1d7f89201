"""The tiny random Llama most tests train (transformers' LlamaForCausalLM, 3 layers, fp32), its
training step, and two models trained side by side to bit-equal losses and gradients."""
import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig, LlamaForCausalLM

from python_tests.support.grads import assert_same_grads


def _deterministic_attention(device):
    # On CUDA the fused SDPA backwards may use atomics; the math kernel is deterministic.
    return sdpa_kernel(SDPBackend.MATH) if device == "cuda" else contextlib.nullcontext()


def _tiny_llama(device, dropout=0.1):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, attention_dropout=dropout,
                         max_position_embeddings=128, attn_implementation="sdpa", use_cache=False)
    return LlamaForCausalLM(config).to(device).train()


def _llama_step(model, ids, device):
    torch.manual_seed(99)
    with _deterministic_attention(device):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return loss


def _steps_match_plain(ours, plain, device, steps=2, shape=(2, 32), after_step=lambda: None):
    """Trains both models `steps` steps on the same batch: losses and gradients equal bit for bit."""
    ids = torch.randint(0, 256, shape, device=device)
    for _ in range(steps):
        for m in (ours, plain):
            m.zero_grad(set_to_none=True)
        assert torch.equal(_llama_step(ours, ids, device), _llama_step(plain, ids, device))
        assert_same_grads(ours, plain)
        after_step()


def _freeze_layer_weights(model):
    """Freezes every decoder-layer weight except the norms (adapter training without PEFT:
    trainable and frozen parameters side by side in each layer)."""
    for name, p in model.named_parameters():
        if ".layers." in name and "norm" not in name:
            p.requires_grad_(False)
    return model



def _train_step(model):
    """One training step on a random batch of 1 x 16 tokens (no seed: for what a step does, not its values)."""
    ids = torch.randint(0, 256, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
