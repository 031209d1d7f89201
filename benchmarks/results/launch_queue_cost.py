"""Session 23: does a kernel launch cost the host more when the GPU has nothing queued? The same
N small launches (x.add_(1) on 4 KiB) timed on the host (a) right after a synchronize (the GPU idle,
each launch reaches an empty queue), (b) behind a long queued kernel (the queue never empties),
(c) in bursts of 8 launches separated by a 150 us host stall (the queue drains at each stall, as
after modules mode's work at a selected call's end), the stall's time subtracted.

    python3 benchmarks/results/launch_queue_cost.py [N]
"""
import sys, time
import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
x = torch.zeros(1024, device="cuda")
big = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")


def spin(us):
    end = time.perf_counter_ns() + us * 1000
    while time.perf_counter_ns() < end:
        pass


def launches(count):
    start = time.perf_counter_ns()
    for _ in range(count):
        x.add_(1)
    return time.perf_counter_ns() - start


for rnd in range(3):
    torch.cuda.synchronize()
    idle = launches(n) / n / 1e3
    torch.cuda.synchronize()
    for _ in range(40):
        big.add_(1)  # ~tens of ms of queued work
    busy = launches(n) / n / 1e3
    torch.cuda.synchronize()
    total = 0
    for _ in range(n // 8):
        spin(150)
        total += launches(8)
    drained = total / (n // 8 * 8) / 1e3
    torch.cuda.synchronize()
    print(f"round {rnd}: us per launch: GPU idle {idle:.2f}, queue busy {busy:.2f}, "
          f"bursts after 150 us stalls {drained:.2f}", flush=True)
