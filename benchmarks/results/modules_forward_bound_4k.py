"""Issue 13 (session 16): is the 4k modules step's forward bound by the host? Per step, interleaved
rounds whose order alternates: the host's forward time (until the loss is returned, nothing
synchronised), the GPU's forward span (CUDA events at the step's start, on the empty queue, and
where the host returned the loss: the later of the host's forward and the GPU's forward work), the
whole step, the caching allocator's device allocations, and the compute stream's wait. Variants:
plain training (none); modules `*.self_attn` with the C save hooks (modules@c) and with the Python
ones (modules@python); modules with every save kept on the GPU, uncopied (nocopy@c); modules with
16 copies in flight instead of 4 (mif16@c).

    python3 benchmarks/results/modules_forward_bound_4k.py [SEQ] [ROUNDS]
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload import _library, activations
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
STEPS = 5
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
variants = ["none", "modules@c", "modules@python", "nocopy@c", "mif16@c"]
OPTIONS = {"modules": {}, "nocopy": {"keep_on_device_bytes": 10 ** 12}, "mif16": {"max_in_flight": 16}}


def enable(v):
    if v == "none":
        return None, lambda: None
    kind, hooks = v.split("@")
    if hooks == "python":
        activations.load_save_hooks = lambda: None
    try:
        handle = torch_offload.apply(model, "modules", targets=["*.self_attn"], **OPTIONS[kind])
    finally:
        activations.load_save_hooks = _library.load_save_hooks
    return handle, handle.remove


rows = {v: {"step": [], "host_fwd": [], "gpu_fwd": [], "allocs": [], "wait": []} for v in variants}
start, forward_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for r in range(rounds):
    for v in (variants if r % 2 == 0 else variants[::-1]):
        handle, undo = enable(v)
        try:
            for _ in range(3):
                model.zero_grad(set_to_none=True)
                model(input_ids=ids, labels=ids).loss.backward()
            torch.cuda.synchronize()
            for _ in range(STEPS):
                model.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                allocs = torch.cuda.memory_stats()["num_device_alloc"]
                wait = handle.stats()["compute_wait_ms"] if handle is not None else 0.0
                t0 = time.perf_counter()
                start.record()
                loss = model(input_ids=ids, labels=ids).loss
                t1 = time.perf_counter()
                forward_end.record()
                loss.backward()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                row = rows[v]
                row["step"].append((t2 - t0) * 1e3)
                row["host_fwd"].append((t1 - t0) * 1e3)
                row["gpu_fwd"].append(start.elapsed_time(forward_end))
                row["allocs"].append(torch.cuda.memory_stats()["num_device_alloc"] - allocs)
                row["wait"].append((handle.stats()["compute_wait_ms"] - wait) if handle is not None else 0.0)
                del loss
        finally:
            undo()
base = statistics.median(rows["none"]["step"])
print(f"seq {seq}, {rounds} interleaved rounds of {STEPS} steps; medians in ms (ratio: step / plain training's step)")
for v, row in rows.items():
    m = {k: statistics.median(x) for k, x in row.items()}
    per_round = [statistics.median(row["step"][i:i + STEPS]) for i in range(0, len(row["step"]), STEPS)]
    print(f"{v:15s} step {m['step']:6.1f} ({m['step'] / base:.3f}x)  host forward {m['host_fwd']:5.1f}  "
          f"GPU forward span {m['gpu_fwd']:5.1f}  backward+rest {m['step'] - m['gpu_fwd']:5.1f}  "
          f"device allocs/step {max(row['allocs'])}  compute wait {m['wait']:.2f}  rounds "
          + " ".join(f"{x:.1f}" for x in per_round))
