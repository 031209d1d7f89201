"""Selective "attention" at 16k: the manager's prefetch depth and in-flight bound, interleaved rounds."""
import statistics, sys, time, json
import torch
sys.path.insert(0, ".")
import torch_offload
from torch_offload.bench.common import REFERENCE, build_llama
seq = 16384
model = build_llama(REFERENCE, "cuda", seq)
ids = torch.randint(0, REFERENCE["vocab"], (1, seq), device="cuda")
V = {"ckpt": None, "sel": {}, "sel_p6": {"prefetch_depth": 6}, "sel_f8": {"max_in_flight": 8},
     "sel_p6_f8": {"prefetch_depth": 6, "max_in_flight": 8}, "qkvo_p8_f8": {"policy": "attention+qkv+out_proj", "prefetch_depth": 12, "max_in_flight": 8}}
def setup(v):
    if v == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}); return model.gradient_checkpointing_disable, None
    h = torch_offload.apply(model, "selective", **V[v]); return h.remove, h
def step():
    model(input_ids=ids, labels=ids).loss.backward(); model.zero_grad(set_to_none=True)
times = {v: [] for v in V}; waits = {}
for r in range(3):
    for v in V:
        undo, h = setup(v)
        step(); torch.cuda.synchronize()
        if h: torch_offload.reset_stats(h.manager)
        ts = []
        for _ in range(3):
            t = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
        if h:
            s = h.stats(); waits[v] = (round(s["compute_wait_ms"] / 3, 1), round(s["host_wait_ms"] / 3, 1))
        undo(); times[v].append(statistics.median(ts))
base = statistics.median(times["ckpt"])
print(json.dumps({v: (round(statistics.median(t), 4), round(base / statistics.median(t), 3)) for v, t in times.items()}))
print("compute_wait_ms, host_wait_ms per step:", json.dumps(waits))
print(json.dumps({v: [round(x, 4) for x in t] for v, t in times.items()}))
