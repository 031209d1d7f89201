"""Does device-to-host traffic slow the host's own code? (Issue 13, session 22.) A host-bound piece of
work, timed alone and while a side stream keeps the link busy with device-to-pinned-host copies
(16 MiB each, as modules mode's): (a) a Python loop of small CPU tensor ops with autograd (the kind
of host work a training step's forward does), (b) launching small CUDA kernels (the forward's
launches; timed on the host, the GPU does not bound them). A loaded pass first queues ~30 ms of
copies on a side stream (no thread of ours runs meanwhile). Alternating passes, medians.

    python3 benchmarks/results/dma_host_interference.py [PASSES]
"""
import statistics, sys, time
import torch

passes = int(sys.argv[1]) if len(sys.argv) > 1 else 15
stream = torch.cuda.Stream()
srcs = [torch.empty(16 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]
dsts = [torch.empty(16 << 20, dtype=torch.uint8, pin_memory=True) for _ in range(8)]


def start_traffic(copies):
    """Queues `copies` device-to-host copies on the side stream (about 0.3 ms each at 54 GB/s):
    the link stays busy while the host measures, with no thread of ours running."""
    with torch.cuda.stream(stream):
        for i in range(copies):
            dsts[i % 8].copy_(srcs[i % 8], non_blocking=True)


w = torch.randn(32, 32, requires_grad=True)
x0 = torch.randn(32, 32)
g = torch.randn(256, device="cuda")


def cpu_work():
    t = time.perf_counter()
    for _ in range(300):
        y = (x0 @ w).relu().sum()
    return (time.perf_counter() - t) * 1e3


def launches():
    t = time.perf_counter()
    for _ in range(1000):
        g.add_(1.0)
    return (time.perf_counter() - t) * 1e3


results = {("cpu", False): [], ("cpu", True): [], ("launch", False): [], ("launch", True): []}
for i in range(passes):
    for loaded in (False, True):
        for kind, work in (("cpu", cpu_work), ("launch", launches)):
            torch.cuda.synchronize()
            if loaded:
                start_traffic(96)  # ~30 ms of link time, longer than either piece of work
            results[(kind, loaded)].append(work())
            torch.cuda.synchronize()
for kind in ("cpu", "launch"):
    idle, loaded = statistics.median(results[(kind, False)]), statistics.median(results[(kind, True)])
    print(f"{kind:7s} link idle {idle:7.3f} ms, link busy {loaded:7.3f} ms: x{loaded / idle:.3f}")
