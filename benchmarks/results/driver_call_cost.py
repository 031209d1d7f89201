"""Session 23: the host cost of the driver calls the engine makes per copy, on the GPU machine's
host: each timed in a loop of N calls from Python, against a loop of a no-op Python call of the same
shape (subtracted). Hot loops: a lower bound of what a call costs inside a step.

    python3 benchmarks/results/driver_call_cost.py [N]
"""
import sys, time
import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
compute = torch.cuda.current_stream()
side = torch.cuda.Stream()
done = torch.cuda.Event()
done.record(compute)
torch.cuda.synchronize()
events = [torch.cuda.Event() for _ in range(n)]
pinned = torch.empty(4096, dtype=torch.uint8, pin_memory=True)
device_small = torch.empty(4096, dtype=torch.uint8, device="cuda")
busy = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")


def loop(body):
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for i in range(n):
        body(i)
    elapsed = time.perf_counter_ns() - start
    torch.cuda.synchronize()
    return elapsed / n / 1e3


def noop(i):
    pass


cases = {
    "event record (compute stream)": lambda i: events[i].record(compute),
    "stream wait (side waits for a done event)": lambda i: side.wait_event(done),
    "event query (done)": lambda i: done.query(),
    "event query (pending)": lambda i: events[-1].query(),
    "empty 1 MiB (caching allocator)": lambda i: torch.empty(1 << 20, dtype=torch.uint8, device="cuda"),
    "H2D 4 KiB from pinned (non_blocking)": lambda i: device_small.copy_(pinned, non_blocking=True),
    "D2H 4 KiB to pinned (non_blocking)": lambda i: pinned.copy_(device_small, non_blocking=True),
}
for rnd in range(2):
    base = loop(noop)
    print(f"round {rnd}: python no-op {base:.2f} us", flush=True)
    for name, body in cases.items():
        if "pending" in name:
            busy.fill_(1)
            busy.mul_(3)
            events[-1].record(compute)
            for _ in range(20):
                busy.add_(1)  # keeps the event pending during the loop
        print(f"  {name:44s} {loop(body) - base:7.2f} us", flush=True)
