"""Host cost of modules mode's saved-tensor hooks on the development machine (CPU, one torch thread):
a 24-layer tiny Llama's step without offloading and with modes="modules" (*.self_attn, min_bytes=0),
median of 20 steps each, then cProfile of 10 modules steps: the share of the step spent in our pack
and unpack hooks (activations.py pack_local and unpack, cumulative).
Run: PYTHONPATH=<checkout> python benchmarks/results/modules_hook_profile_cpu.py"""
import cProfile
import pstats
import statistics
import time
import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import torch_offload

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=24, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa", use_cache=False)
model = LlamaForCausalLM(cfg).train()
ids = torch.randint(0, 256, (1, 16))


def step():
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()


def median_ms(n=20):
    for _ in range(3):
        step()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


print(f"none step {median_ms():.1f} ms")
torch_offload.apply(model, "modules", targets=["*.self_attn"], min_bytes=0)
print(f"modules step {median_ms():.1f} ms")
profile = cProfile.Profile()
profile.enable()
for _ in range(10):
    step()
profile.disable()
stats = pstats.Stats(profile).stats
total = sum(tt for _, _, tt, _, _ in stats.values())
hooks = sum(ct for (path, _, name), (_, _, _, ct, _) in stats.items()
            if path.endswith("torch_offload/activations.py") and name in ("pack_local", "unpack"))
print(f"profiled: {total * 1e3:.0f} ms in 10 modules steps, {hooks * 1e3:.0f} ms ({hooks / total:.0%}) in our pack/unpack hooks")
