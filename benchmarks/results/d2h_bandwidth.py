"""Device-to-pinned-host bandwidth as modules mode's copies see it: 16 MiB copies, 64 back to back on
a side stream into separate pinned buffers (best of 5 passes), and one 256 MiB copy (best of 3).
Session 22: run per NUMA binding (numa_run.py) to see whether the host buffers' node moves it.

    python3 benchmarks/results/d2h_bandwidth.py
"""
import torch

stream = torch.cuda.Stream()


def best_gbps(pairs, passes):
    best = 0.0
    for _ in range(passes):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record()
            for src, dst in pairs:
                dst.copy_(src, non_blocking=True)
            end.record()
        end.synchronize()
        nbytes = sum(src.numel() for src, _ in pairs)
        best = max(best, nbytes / (start.elapsed_time(end) / 1e3) / 1e9)
    return best


small = [(torch.empty(16 << 20, dtype=torch.uint8, device="cuda"), torch.empty(16 << 20, dtype=torch.uint8, pin_memory=True))
         for _ in range(64)]
big = [(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True))]
best_gbps(small[:4], 1)
print(f"d2h 64 x 16 MiB: {best_gbps(small, 5):.1f} GB/s; 1 x 256 MiB: {best_gbps(big, 3):.1f} GB/s", flush=True)
