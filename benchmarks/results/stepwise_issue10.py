"""Issue 10 (session 16): hidden_states and selective "attention" against torch's checkpointing,
alternated step by step in one process, so that the host's speed and the GPU's clocks, which drift
between rounds, are shared by each set of steps. Each variant keeps its own manager (its pinned
pool stays warm) and is applied before its step and removed after it; checkpointing is the
model's own gradient_checkpointing_enable(use_reentrant=False).

    python3 benchmarks/results/stepwise_issue10.py [SEQ] [SETS] [VARIANTS]

VARIANTS (comma-separated): ckpt, hidden, hidden_nocopy (every block input kept on the GPU,
uncopied), selective ("attention"), selective_re (its reentrant variant). Per variant: the median
step, and the median and mean over the sets of checkpointing's step / the variant's step (>1:
faster than checkpointing).
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, TINY, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
sets = int(sys.argv[2]) if len(sys.argv) > 2 else 20
variants = (sys.argv[3] if len(sys.argv) > 3 else "ckpt,hidden,selective").split(",")
device = "cuda" if torch.cuda.is_available() else "cpu"
shape = REF if device == "cuda" else TINY  # CPU: a smoke run
model = build_llama(shape, device, seq)
ids = torch.randint(0, shape["vocab"], (1, seq), device=device)
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
managers = {v: torch_offload.OffloadManager(keep_on_device_bytes=10 ** 12 if v == "hidden_nocopy" else 0)
            for v in variants if v != "ckpt"}


def enable(v):
    if v == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model.gradient_checkpointing_disable
    mode = "selective" if v.startswith("selective") else "hidden_states"
    options = {"policy": "attention"} if mode == "selective" else {}
    if v.endswith("_re"):
        options["use_reentrant"] = True
    return torch_offload.apply(model, mode, manager=managers[v], **options).remove


def step(v):
    undo = enable(v)
    try:
        model.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        sync()
        return (time.perf_counter() - t0) * 1e3
    finally:
        undo()


for i in range(2 * len(variants)):
    step(variants[i % len(variants)])
times = {v: [] for v in variants}
for i in range(sets):
    shift = i % len(variants)
    for v in variants[shift:] + variants[:shift]:
        times[v].append(step(v))
print(f"seq {seq}, {sets} sets of one step per variant (order rotating); medians in ms")
for v in variants:
    speed = [c / t for c, t in zip(times["ckpt"], times[v])] if "ckpt" in times else []
    extra = (f"  ckpt / variant: median {statistics.median(speed):.4f}x, mean {statistics.mean(speed):.4f}x"
             if speed and v != "ckpt" else "")
    print(f"{v:14s} {statistics.median(times[v]):8.1f} ms{extra}")
