"""Issue 13 (session 20): where the host thread waits in a training step. torch.profiler over a few
steps of each variant; per variant, the CUDA runtime calls and the synchronizing aten ops by host
time (self CPU total, calls), per step; and the synchronizing calls torch.cuda's sync debug mode
reports in one step (where in the model they come from).

    python3 benchmarks/results/host_sync_profile.py [SEQ] [STEPS] [VARIANTS]

VARIANTS: plain, modules (`*.self_attn`), d2h (plain with 1.5 GB of device-to-host copies queued on a
side stream at the step's start, as in dma_host_effect.py).
"""
import copy, os, sys, traceback, warnings
import torch
from torch.profiler import ProfilerActivity, profile
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
variants = (sys.argv[3] if len(sys.argv) > 3 else "plain,modules,d2h").split(",")
base = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
models = {"plain": base, "d2h": base}
if "modules" in variants:
    models["modules"] = copy.deepcopy(base)
    torch_offload.apply(models["modules"], "modules", targets=["*.self_attn"])
chunk = 64 << 20
device_buffer = torch.empty(chunk, dtype=torch.uint8, device="cuda")
hosts = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(23)]
side = torch.cuda.Stream()


def step(v):
    model = models[v]
    if v == "d2h":
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for host in hosts:
                host.copy_(device_buffer, non_blocking=True)
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


for v in variants:
    for _ in range(3):
        step(v)
    torch.cuda.synchronize()
    # Where the step synchronizes: sync debug mode warns at each synchronizing call.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(v)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    print(f"== {v}: {len(syncs)} synchronizing calls in one step (sync debug mode)")
    for w in syncs[:6]:
        print(f"   {w.message} at {w.filename}:{w.lineno}")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(v)
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages()
            if e.key.startswith("cuda") or e.key in ("aten::item", "aten::_local_scalar_dense", "aten::nonzero",
                                                     "aten::is_nonzero", "aten::to", "aten::copy_")]
    rows.sort(key=lambda e: -e.self_cpu_time_total)
    print(f"== {v}: host time per step (ms) and calls per step")
    for e in rows[:14]:
        print(f"   {e.key:40s} self {e.self_cpu_time_total / 1e3 / steps:8.3f}  total {e.cpu_time_total / 1e3 / steps:8.3f}"
              f"  calls {e.count / steps:7.1f}")
