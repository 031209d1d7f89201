"""Issue 13 (session 17): host cost of one save through offload_activations' hooks on the development
machine (CPU, one torch thread): a save that shares an existing copy (a transpose, a slice, a flat
view of a saved tensor) and a new save (a 64x64 float tensor, copied synchronously on CPU). Best of
several rounds, microseconds per save; the hooks are the C ones where built.

    python3 benchmarks/results/shared_save_cost_cpu.py
"""
import time

import torch

from torch_offload.activations import offload_activations

torch.set_num_threads(1)
hooks = offload_activations("all", min_bytes=0, warn_on_exit=False)
x = torch.randn(256, 256)
first = hooks.pack_hook(x)  # the copy the others share
views = [x.t(), x[:128], x.view(-1)]


def shared_us(n=2000):
    t = time.perf_counter()
    keep = [hooks.pack_hook(views[i % 3]) for i in range(n)]
    elapsed = (time.perf_counter() - t) / n * 1e6
    del keep
    return elapsed


def new_us(n=300):
    tensors = [torch.randn(64, 64) for _ in range(n)]
    t = time.perf_counter()
    keep = [hooks.pack_hook(a) for a in tensors]
    elapsed = (time.perf_counter() - t) / n * 1e6
    del keep
    return elapsed


print(f"C hooks: {type(hooks.pack_hook).__name__ != 'function'}; shared save {min(shared_us() for _ in range(7)):.2f} us, "
      f"new save (CPU copy 16 KB) {min(new_us() for _ in range(5)):.2f} us")
