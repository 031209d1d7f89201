"""Issue 10: host time of one attention call as selective "attention" intercepts it (GPU kept busy, so
only the host's time counts), at the reference model's 4k shape: torch's call alone, under an empty
Python dispatch mode, under our forward offload mode with nothing copied (min_bytes above every output),
and with the outputs offloaded (the in-flight bound, 4 copies, can block the host here: the copies
wait behind the queued work).

    python3 benchmarks/results/sdpa_interception_cost.py [SEQ]
"""
import os, statistics, sys, time
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
sys.path.insert(0, os.getcwd())
from torch_offload import policies
from torch_offload.manager import default_manager
from torch_offload.attention_offload import _FusedOutputs
from torch_offload.selective import _Offloaded

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
dev = "cuda" if torch.cuda.is_available() else "cpu"
dt = torch.bfloat16 if dev == "cuda" else torch.float32
q, k, v = (torch.randn(1, 16, seq, 128, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
busy = torch.randn(8192, 8192, device=dev, dtype=dt)


class Nop(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def per_call_us(fn, n=24):
    samples = []
    for _ in range(7):
        for _ in range(6 if dev == "cuda" else 0):  # tens of ms of GPU work queued: the calls below only enqueue
            busy @ busy
        t = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t) / n * 1e6)
        if dev == "cuda":
            torch.cuda.synchronize()
    return statistics.median(samples)


copying = _Offloaded(default_manager(), 1 << 16)
nocopy = _Offloaded(default_manager(), 1 << 40)
seen = []


class Log(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        seen.append(str(func))
        return func(*args, **(kwargs or {}))


def call():
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def under(mode, offloaded=None):
    def run():
        with mode:
            call()
        if offloaded is not None:
            offloaded.calls.clear()
    return run


with Log():
    call()
print("ops the mode sees:", seen)
rows = {
    "torch's call": call,
    "under an empty mode": under(Nop()),
    "our mode, nothing copied": under(_FusedOutputs(policies.ATTENTION_OPS, nocopy, False), nocopy),
    "our mode, outputs offloaded": under(_FusedOutputs(policies.ATTENTION_OPS, copying, False), copying),
    "enter + exit an empty mode": lambda: Nop().__enter__().__exit__(None, None, None),
}
for name, fn in rows.items():
    fn(); fn()
    print(f"{name:30s} {per_call_us(fn):8.1f} us per call")
