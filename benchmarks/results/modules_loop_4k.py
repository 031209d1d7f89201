"""A 4k modules `*.self_attn` training loop for a sampling profiler (py-spy --native): STEPS steps
after two warm-up steps, on the reference model.

python3 benchmarks/results/modules_loop_4k.py [STEPS] [MODE]   (MODE: modules (default), none, or
modules_keep (session 20): modules with min_bytes=2**62, every save kept on the GPU)"""
import sys
import time

import torch

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from benchmarks.common import REFERENCE, build_llama  # noqa: E402

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
mode = sys.argv[2] if len(sys.argv) > 2 else "modules"
model = build_llama(REFERENCE, "cuda", 4096)
ids = torch.randint(0, REFERENCE["vocab"], (1, 4096), device="cuda")
if mode in ("modules", "modules_keep"):
    options = {"min_bytes": 1 << 62} if mode == "modules_keep" else {}
    torch_offload.apply(model, "modules", targets=["*.self_attn"], **options)


def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


for _ in range(2):
    step()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(steps):
    step()
torch.cuda.synchronize()
print(f"{mode}: {(time.perf_counter() - t) / steps * 1e3:.1f} ms per step", flush=True)
