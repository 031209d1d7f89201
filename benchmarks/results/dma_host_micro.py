"""Issue 13 (session 20): which host work does device-to-host DMA slow? dma_host_effect.py showed a
4k training forward (host-bound) 27 ms slower with 1.5 GB of device-to-host copies in flight, and
no slower with the same host-to-device. Here three kinds of host work, each timed alone and while
GB of copies run on a side stream (queued just before; they last longer than the work):
  interp    a pure Python loop (the interpreter, cache-resident)
  launch    small CUDA kernels launched back to back (the driver's launch path; the GPU keeps up)
  memcpy    a 256 MB CPU tensor copy (host memory bandwidth)
Traffic: none, d2h (64 MB chunks into distinct pinned buffers), d2h_small (the same bytes into one
8 MB pinned buffer again and again: a destination that stays in the last-level cache), h2d.

    python3 benchmarks/results/dma_host_micro.py [GB] [REPEATS]
"""
import statistics, sys, time
import torch

gb = float(sys.argv[1]) if len(sys.argv) > 1 else 1.5
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 15
chunk, small = 64 << 20, 8 << 20
device_buffer = torch.empty(chunk, dtype=torch.uint8, device="cuda")
hosts = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(int(gb * 1e9 / chunk))]
small_host = torch.empty(small, dtype=torch.uint8, pin_memory=True)
side = torch.cuda.Stream()
tiny = torch.zeros(256, device="cuda")
cpu_a, cpu_b = torch.ones(256 << 20, dtype=torch.uint8), torch.empty(256 << 20, dtype=torch.uint8)


def traffic(kind):
    with torch.cuda.stream(side):
        if kind == "d2h":
            for host in hosts:
                host.copy_(device_buffer, non_blocking=True)
        elif kind == "d2h_small":
            for _ in range(len(hosts) * (chunk // small)):
                small_host.copy_(device_buffer[:small], non_blocking=True)
        elif kind == "h2d":
            for host in hosts:
                device_buffer.copy_(host, non_blocking=True)


def work(kind):
    if kind == "interp":
        x = 0
        for i in range(300_000):
            x += i
    elif kind == "launch":
        for _ in range(2000):
            tiny.add_(1)
    elif kind == "memcpy":
        cpu_b.copy_(cpu_a)


results = {}
for w in ("interp", "launch", "memcpy"):
    for t in ("none", "d2h", "d2h_small", "h2d"):
        results[(w, t)] = []
for r in range(repeats + 2):
    for w in ("interp", "launch", "memcpy"):
        for t in ("none", "d2h", "d2h_small", "h2d"):
            torch.cuda.synchronize()
            traffic(t)
            t0 = time.perf_counter()
            work(w)
            elapsed = (time.perf_counter() - t0) * 1e3
            t1 = time.perf_counter()
            side.synchronize()
            left = (time.perf_counter() - t1) * 1e3
            torch.cuda.synchronize()
            if r >= 2:
                results[(w, t)].append((elapsed, left))
print(f"{len(hosts)} x 64 MB = {len(hosts) * chunk / 1e9:.2f} GB of copies per run; medians of {repeats} runs "
      "(ms); 'copies left' = how long the copies still ran after the work (> 0: they covered it)")
for w in ("interp", "launch", "memcpy"):
    alone = statistics.median(e for e, _ in results[(w, "none")])
    for t in ("none", "d2h", "d2h_small", "h2d"):
        e = statistics.median(e for e, _ in results[(w, t)])
        left = statistics.median(l for _, l in results[(w, t)])
        print(f"{w:7s} {t:10s} {e:7.2f} ms  x{e / alone:5.2f}  copies left {left:6.2f} ms")
