"""Issue 10: where selective's forward spends its host time at 4k, against hidden_states. Per variant:
the forward's host time over 5 steps, then one forward under torch's profiler (CPU ops by self time,
CUDA runtime calls), the backward outside it.

    python3 benchmarks/results/profile_forward_4k.py [SEQ] [VARIANTS]
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
variants = (sys.argv[2] if len(sys.argv) > 2 else "hidden_states,selective").split(",")
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
for v in variants:
    reentrant = v.endswith("_re")
    h = torch_offload.apply(model, v[:-3] if reentrant else v, **({"use_reentrant": True} if reentrant else {}))
    host = []
    for i in range(8):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); t = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        host.append(time.perf_counter() - t)
        loss.backward(); torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward(); torch.cuda.synchronize()
    h.remove()
    print(f"=== {v}: forward host {statistics.median(host[3:]) * 1e3:.1f} ms (median of 5)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
