"""Issue 13 (session 22): does modules mode make the CUDA caching allocator go to the driver during
4k steps? For plain training and modules (`*.self_attn`), after warm-up, the allocator's counters over
N steps: cudaMalloc / cudaFree calls (num_device_alloc / num_device_free), allocation retries (each
frees every cached block and synchronizes), syncs of all streams, and allocations made; plus the
median step. A driver allocation costs the host far more than a cached one, and in a host-bound
forward that is step time.

    python3 benchmarks/results/allocator_churn_4k.py [SEQ] [STEPS]
"""
import copy, os, statistics, sys, time, warnings
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

warnings.simplefilter("ignore")
seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
base = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams",
        "allocation.all.allocated", "segment.all.allocated", "segment.all.freed")
print("PYTORCH_CUDA_ALLOC_CONF =", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(unset)"))
for variant in ("plain", "modules", "plain", "modules"):
    model = copy.deepcopy(base)
    if variant == "modules":
        torch_offload.apply(model, "modules", targets=["*.self_attn"])
    for _ in range(5):
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    after = torch.cuda.memory_stats()
    per_step = {k: (after.get(k, 0) - before.get(k, 0)) / steps for k in KEYS}
    print(f"{variant:8s} step {statistics.median(times):7.2f} ms; per step: "
          + ", ".join(f"{k} {v:.1f}" for k, v in per_step.items()), flush=True)
    del model
    torch.cuda.empty_cache()
