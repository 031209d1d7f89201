"""Host cost of the offload hooks' save path on the development machine (CPU, one torch thread):
pack / unpack per tensor through offload_activations, a 24-layer tiny Llama step in `all` and
`modules` modes, and flat_args against pytree. Run it with PYTHONPATH at a checkout to compare
versions: python benchmarks/results/save_path_cost_cpu.py"""
import statistics, time, warnings
import torch
from torch.utils import _pytree as pytree
from transformers import LlamaConfig, LlamaForCausalLM
import torch_offload
from torch_offload.activations import offload_activations

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


def best_us(fn, per, reps=30, rounds=5):
    best = 1e9
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t) / reps / per * 1e6)
    return round(best, 1)


hooks = offload_activations("all", min_bytes=0, warn_on_exit=False)
base = torch.randn(64, 64, requires_grad=True)
packs = lambda: [hooks.pack_hook(base * 1) for _ in range(200)]  # noqa: E731
mul = best_us(lambda: [base * 1 for _ in range(200)], 200)
result = {"pack_us": round(best_us(packs, 200) - mul, 1)}
packed = packs()
result["unpack_us"] = best_us(lambda: [hooks.unpack_hook(p) for p in packed], 200)

cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=24, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa", use_cache=False)
model = LlamaForCausalLM(cfg).train()
ids = torch.randint(0, 256, (1, 16))


def step_ms(n=30):
    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
    for _ in range(5):
        step()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
    return round(statistics.median(ts) * 1e3, 1)


result["none_step_ms"] = step_ms()
for mode, options in (("all", {}), ("modules", {"targets": ["*.self_attn"]})):
    handle = torch_offload.apply(model, mode, min_bytes=0, **options)
    result[f"{mode}_step_ms"] = step_ms()
    handle.remove()
try:
    from torch_offload.flat_args import flatten, unflatten
    t = torch.randn(2)
    call = ((t,), {"attention_mask": None, "position_ids": t, "use_cache": False, "cache_position": t,
                   "position_embeddings": (t, t)})
    result["flat_args_us"] = best_us(lambda: unflatten(*flatten(call)), 1, reps=20000, rounds=3)
    result["pytree_us"] = best_us(lambda: pytree.tree_unflatten(*pytree.tree_flatten(call)), 1, reps=20000, rounds=3)
except ImportError:
    pass
print(result)
