"""Issue 13 (session 20): the 4k modules step's ratio to plain training moves between processes on one
machine (1.08x / 1.20x back to back in call 11). Is the link what moves? In one process: plain
training and modules (`*.self_attn`) step by step, each on its own model copy; per modules step the
host's wait on the in-flight bound and the compute stream's wait on copies (the manager's
statistics); and the device-to-host bandwidth into separately pinned 16 MB buffers (the pool's size
class), timed as one batch of 96 copies before and after the steps. Run it as several processes.

    python3 benchmarks/results/modules_process_spread_4k.py [SETS]
"""
import copy, os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

sets = int(sys.argv[1]) if len(sys.argv) > 1 else 30
base = build_llama(REF, "cuda", 4096)
ids = torch.randint(0, REF["vocab"], (1, 4096), device="cuda")
modules = copy.deepcopy(base)
handle = torch_offload.apply(modules, "modules", targets=["*.self_attn"])
chunk = 16 << 20
source = torch.empty(chunk, dtype=torch.uint8, device="cuda")
pinned = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(96)]


def d2h_gbps():
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(side):
        start.record()
        for host in pinned:
            host.copy_(source, non_blocking=True)
        end.record()
    end.synchronize()
    return len(pinned) * chunk / (start.elapsed_time(end) / 1e3) / 1e9


def step(model):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return (time.perf_counter() - t0) * 1e3


link_before = statistics.median(d2h_gbps() for _ in range(5))
for _ in range(3):
    step(base), step(modules)
ratios, host_wait, compute_wait = [], [], []
for i in range(sets):
    before = handle.manager.stats()
    if i % 2:
        p, m = step(base), step(modules)
    else:
        m, p = step(modules), step(base)
    after = handle.manager.stats()
    ratios.append(m / p)
    host_wait.append(after["host_wait_ms"] - before["host_wait_ms"])
    compute_wait.append(after["compute_wait_ms"] - before["compute_wait_ms"])
link_after = statistics.median(d2h_gbps() for _ in range(5))
print(f"pid {os.getpid()}: modules / plain median {statistics.median(ratios):.4f}x over {sets} sets; per modules "
      f"step host wait {statistics.median(host_wait):.2f} ms, compute wait {statistics.median(compute_wait):.2f} ms; "
      f"device-to-host into 16 MB pinned buffers {link_before:.1f} GB/s before, {link_after:.1f} GB/s after")
