"""Issue 10 (session 18): what is alive on the GPU after selective "attention"'s forward, with the stand-in and
with the dispatch-mode path: each live allocation of at least 16 MB with the Python frames that made it (a memory
snapshot per path, after one warm-up step each).

    python3 benchmarks/results/stand_in_after_forward.py [SEQ]
"""
import collections, importlib, os, sys
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
attention = importlib.import_module("torch_offload.attention_offload")
frame_of_context = attention.frame_of_context
handle = torch_offload.apply(model, "selective", policy="attention")


def frames(block):
    stack = block.get("frames") or next((e.get("frames", []) for e in reversed(block.get("history", []))), [])
    names = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in stack
             if "torch_offload" in f["filename"] or "modeling_llama" in f["filename"]]
    return " < ".join(names[:6]) or "?"


for path in ("stand_in", "mode"):
    attention.frame_of_context = frame_of_context if path == "stand_in" else (lambda: None)
    model(input_ids=ids, labels=ids).loss.backward()  # warm-up
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    loss = model(input_ids=ids, labels=ids).loss
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live = collections.Counter()
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["state"] == "active_allocated" and block["size"] >= 16 << 20:
                live[(block["size"] >> 20, frames(block))] += 1
    print(f"== {path}: allocated after forward {torch.cuda.memory_allocated() / 1e9:.3f} GB; live blocks >= 16 MB:")
    for (mb, where), n in sorted(live.items(), key=lambda kv: -kv[0][0] * kv[1]):
        print(f"  {n:3d} x {mb:5d} MB  {where}")
    loss.backward()
    del loss
    model.zero_grad(set_to_none=True)
