"""Where the host time of offload_restore goes (op_host_cost measured ~183 us per call against ~4.5 us
for torch's own copy from pinned memory): the restore loop of op_host_cost under torch.profiler (CPU
and CUDA runtime calls), with the GPU busy and with it idle, and each case timed without the
profiler too."""
import statistics, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
sys.path.insert(0, ".")
import torch_offload
from torch_offload._ops import offload_restore, offload_save
sys.path.insert(0, "benchmarks")
from op_host_cost import busy_gpu


def run(busy: bool, calls=200, prefetch_depth=1, profiled=False):
    manager = torch_offload.OffloadManager(max_in_flight=0, prefetch_depth=prefetch_depth)
    mid = manager.id()
    x = torch.empty(2**19, dtype=torch.bfloat16, device="cuda")
    handles = [offload_save(x, mid) for _ in range(calls)]
    manager.synchronize()
    handles.reverse()
    torch.cuda.synchronize()
    if busy:
        busy_gpu(300.0)
    outs = []
    t = time.perf_counter()
    if profiled:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for h in handles:
                outs.append(offload_restore(h, x.device, mid))
    else:
        for h in handles:
            outs.append(offload_restore(h, x.device, mid))
    us = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    stats = manager.stats()
    del outs, handles
    manager.synchronize()
    return us, stats, (prof if profiled else None)


for busy in (True, False):
    for depth in (1, 0):
        us = statistics.median(run(busy, prefetch_depth=depth)[0] for _ in range(3))
        print(f"busy={busy} prefetch_depth={depth}: {us:.1f} us per restore", flush=True)
us, stats, prof = run(True, profiled=True)
print(f"profiled, busy: {us:.1f} us per restore; stats {({k: stats[k] for k in ('restores', 'prefetches', 'prefetch_hits', 'compute_wait_ms')})}")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
