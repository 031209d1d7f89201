"""Host cost of one save through the offload hooks on the development machine (2 cores, one torch
thread): the pack and unpack hooks of offload_activations("all", min_bytes=0) on 2000 non-leaf
64x64 CPU tensors, beside the engine's offload_save / offload_restore ops alone. Two passes (the first
also fills the host pool). Run from a checkout: PYTHONPATH=<checkout> python save_hook_cost_cpu.py

The repro of the Python table's wrong gradients (sessions 2-11) is at the end: two slices of one
storage, the first contiguous and over half of it; it prints whether w's gradient equals plain
autograd's, and the largest difference."""
import contextlib
import time

import torch

from torch_offload._ops import offload_restore, offload_save
from torch_offload.activations import offload_activations

torch.set_num_threads(1)
hooks = offload_activations("all", min_bytes=0, warn_on_exit=False)
pack, unpack, manager_id = hooks.pack_hook, hooks.unpack_hook, hooks.manager.id()
w0 = torch.randn(64, 64, requires_grad=True)
xs = [w0 * 1.0 for _ in range(2000)]


def bench(name, f, n=2000):
    t = time.perf_counter()
    for i in range(n):
        f(i)
    print(f"{name}: {(time.perf_counter() - t) / n * 1e6:.1f} us")


for _ in range(2):
    packed = [None] * len(xs)
    bench("hook pack", lambda i: packed.__setitem__(i, pack(xs[i])))
    bench("hook unpack", lambda i: unpack(packed[i]))
    del packed
    handles = [None] * len(xs)
    bench("offload_save op", lambda i: handles.__setitem__(i, offload_save(xs[i].detach(), manager_id)))
    bench("offload_restore op", lambda i: offload_restore(handles[i], xs[i].device, manager_id))
    del handles


def slices_grad(with_hooks):
    torch.manual_seed(0)
    base = torch.randn(4096, 64)
    w = torch.randn(64, 64, requires_grad=True)
    scope = offload_activations("all", min_bytes=0, warn_on_exit=False) if with_hooks else contextlib.nullcontext()
    with scope:
        y = (base[:3000] @ w).sum() + (base[3000:] @ w).sum()
    y.backward()
    return w.grad


plain, ours = slices_grad(False), slices_grad(True)
print("two slices of one storage: gradients equal:", torch.equal(plain, ours),
      "largest difference:", (plain - ours).abs().max().item())
