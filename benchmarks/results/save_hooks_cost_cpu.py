"""Issue 13 (session 16, no GPU): host time per saved tensor of offload_activations' hooks on CPU,
the C save hooks against the Python ones (run it twice, the second time with
TORCH_OFFLOAD_PYTHON_SAVE_HOOKS=1), beside the two ops called directly from Python and bare
identity hooks. 64 tensors of 16 floats (min_bytes=0), so the copies cost next to nothing.

    python3 benchmarks/results/save_hooks_cost_cpu.py
"""
import os, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload._ops import offload_pack_filtered, offload_unpack
from torch_offload.activations import offload_activations

hooks = offload_activations("all", min_bytes=0)
kept_hooks = offload_activations("all", min_bytes=1 << 40)
x = torch.randn(16, requires_grad=True)
tensors = [x * 2 for _ in range(64)]
manager_id, filter_id = hooks.manager.id(), hooks.filter.id


def per_tensor_us(fn, rounds=5, n=20):
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n / len(tensors) * 1e6)
    return best


def through_hooks():
    for p in [hooks.pack_hook(t) for t in tensors]:
        hooks.unpack_hook(p)


def ops_from_python():
    for p, t in [(offload_pack_filtered(t, manager_id, filter_id), t) for t in tensors]:
        offload_unpack(p[0], t.device, manager_id)


print("hooks:", "Python" if os.environ.get("TORCH_OFFLOAD_PYTHON_SAVE_HOOKS") == "1" else "C")
print(f"pack + unpack through the hooks: {per_tensor_us(through_hooks):.2f} us per tensor")
print(f"pack of a kept tensor: {per_tensor_us(lambda: [kept_hooks.pack_hook(t) for t in tensors]):.2f} us per tensor")
print(f"the two ops called from Python: {per_tensor_us(ops_from_python):.2f} us per tensor")
print(f"bare identity functions: {per_tensor_us(lambda: [(lambda p: p)((lambda t: t)(t)) for t in tensors]):.2f} us per tensor")
