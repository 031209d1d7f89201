#!/usr/bin/env python3
"""Host time per call of offload_save and offload_restore on CUDA (what a host-bound step pays per
offloaded tensor), beside torch's own copy to pinned memory as a yardstick.

The GPU is kept busy by a queue of matrix products first, so every copy is only enqueued: the time
measured is the host's alone. Per size: the median over rounds of the mean time of `--calls` calls.
Prints one JSON line per size; --json FILE also writes them to FILE.

GPU: python3 benchmarks/op_host_cost.py [--calls 200] [--sizes-mb 1,16] [--json FILE]
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from torch_offload import offload_restore, offload_save  # noqa: E402


def busy_gpu(ms: float) -> None:
    """Queues about `ms` of matrix products on the current stream, as few long ones (a few ms each):
    with short ones (0.2 ms) the driver's launch queue fills, and every later call the host makes
    waits for a slot, at the GPU's pace: the time measured would be the queue's, not the op's."""
    a = torch.randn(12288, 12288, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    a @ a
    end.record()
    end.synchronize()
    for _ in range(max(1, int(ms / max(start.elapsed_time(end), 1e-3)))):
        a @ a


def per_call_us(fn, calls: int, rounds: int = 5, between=lambda: None) -> float:
    samples = []
    for _ in range(rounds):
        between()
        torch.cuda.synchronize()
        busy_gpu(200.0)
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--sizes-mb", default="1,16")
    p.add_argument("--json", default="")
    args = p.parse_args()
    manager = torch_offload.OffloadManager(max_in_flight=0)  # unbounded: the host never waits on a copy
    mid = manager.id()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": args.calls, "sizes": []}
    for mb in (float(v) for v in args.sizes_mb.split(",")):
        x = torch.empty(int(mb * 2**20) // 2, dtype=torch.bfloat16, device="cuda")
        pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        handles = []
        row = {"MB": mb,
               "offload_save_us": per_call_us(lambda: handles.append(offload_save(x, mid)), args.calls,
                                              between=handles.clear),
               "torch_copy_to_pinned_us": per_call_us(lambda: pinned.copy_(x, non_blocking=True), args.calls)}
        manager.synchronize()
        handles.reverse()  # restored in reverse save order, as backward does
        it = iter(handles * 5)
        row["offload_restore_us"] = per_call_us(lambda: offload_restore(next(it), x.device, mid), args.calls)
        row["torch_copy_from_pinned_us"] = per_call_us(lambda: x.copy_(pinned, non_blocking=True), args.calls)
        del handles, it
        manager.synchronize()
        result["sizes"].append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
