"""Issue 13 (session 16): the C save hooks (pyext/save_hooks.cpp) against the Python hooks they stand
in for, in one process: interleaved rounds whose order alternates, plain training (none) as the
baseline. The Python hooks are what offload_activations builds when load_save_hooks() gives None.

    python3 benchmarks/results/save_hooks_ab.py [SEQ] [ROUNDS] [MODES]

Per variant: the median step, its ratio to plain training's step, the median per round, the
compute stream's wait per step, and the hook calls per step (saves + restores from the stats).
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload import _library, activations
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
modes = (sys.argv[3] if len(sys.argv) > 3 else "modules").split(",")
assert _library.load_save_hooks() is not None, "the C save hooks did not load"
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
variants = ["none"] + [f"{m}@{h}" for m in modes for h in ("c", "python")]
STEPS = 5


def enable(v):
    if v == "none":
        return None, lambda: None
    mode, hooks = v.split("@")
    if hooks == "python":
        activations.load_save_hooks = lambda: None
    try:
        opts = {"targets": ["*.self_attn"]} if mode == "modules" else {}
        handle = torch_offload.apply(model, mode, **opts)
    finally:
        activations.load_save_hooks = _library.load_save_hooks
    return handle, handle.remove


def step():
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()


times = {v: [] for v in variants}
waits = {v: [] for v in variants}
calls = {}
for r in range(rounds):
    for v in (variants if r % 2 == 0 else variants[::-1]):
        handle, undo = enable(v)
        try:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            before = handle.stats() if handle is not None else None
            for _ in range(STEPS):
                t = time.perf_counter(); step(); torch.cuda.synchronize()
                times[v].append(time.perf_counter() - t)
            if handle is not None:
                after = handle.stats()
                waits[v].append((after["compute_wait_ms"] - before["compute_wait_ms"]) / STEPS)
                calls[v] = {k: (after[k] - before[k]) / STEPS for k in ("saved_tensors", "offloaded_saves", "kept_saves",
                                                                        "saves", "restores") if k in after}
        finally:
            undo()
base = statistics.median(times["none"])
print(f"seq {seq}, {rounds} interleaved rounds of {STEPS} steps (median step; ratio = the variant's step / plain training's)")
for v, ts in times.items():
    per_round = [statistics.median(ts[i:i + STEPS]) * 1e3 for i in range(0, len(ts), STEPS)]
    wait = f"  compute wait {statistics.median(waits[v]):.2f} ms/step" if waits[v] else ""
    print(f"{v:16s} {statistics.median(ts) * 1e3:7.1f} ms  {statistics.median(ts) / base:.3f}x  rounds "
          + " ".join(f"{x:.1f}" for x in per_round) + wait + (f"  per step {calls[v]}" if v in calls else ""))
