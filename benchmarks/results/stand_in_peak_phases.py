"""Issue 10 (session 18): selective "attention"'s peak allocated memory with the stand-in (stand_in.py) against the
dispatch-mode path, split into forward and backward, one model, the same handle switched between the paths.

    python3 benchmarks/results/stand_in_peak_phases.py [SEQ] [STEPS]
"""
import importlib, os, sys
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
attention = importlib.import_module("torch_offload.attention_offload")
frame_of_context = attention.frame_of_context
handle = torch_offload.apply(model, "selective", policy="attention")
GB = 1e9
for i in range(2 * steps + 2):
    path = "stand_in" if i % 2 == 0 else "mode"
    attention.frame_of_context = frame_of_context if path == "stand_in" else (lambda: None)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = model(input_ids=ids, labels=ids).loss
    torch.cuda.synchronize()
    fwd_peak, after_fwd = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated()
    if i >= 2:
        print(f"{path:9s} start {base / GB:6.2f} GB  forward peak {fwd_peak / GB:6.2f}  after forward {after_fwd / GB:6.2f}  "
              f"backward peak {bwd_peak / GB:6.2f}")
    del loss
