"""Forward and backward of a 4k step timed apart, without a profiler (issue 13): plain training,
modules `*.self_attn` with no copies, modules. Per variant, medians over interleaved rounds of:
  step        a whole training step (as bench_modules times it)
  fwd_host    forward returning (the host's time; the GPU may still be working)
  fwd         forward with the compute stream drained (not the copy streams)
  bwd         backward started on a drained compute stream, to the device idle
and per step the caching allocator's device allocations and retries, and the manager's waits.

(modules_nogc: modules with Python's garbage collector off during its steps.)

python3 benchmarks/results/modules_phases_4k.py [SEQ] [ROUNDS]"""
import gc
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from benchmarks.common import reference_from_argv  # noqa: E402

warnings.simplefilter("ignore", torch_offload.NothingOffloadedWarning)
seq, rounds, model, ids = reference_from_argv(4096, 4)


def modules(**options):
    return torch_offload.apply(model, "modules", targets=["*.self_attn"], **options)


VARIANTS = {"none": lambda: None, "nocopy": lambda: modules(keep_on_device_bytes=int(1e12)), "modules": modules,
            "modules_nogc": modules}


def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


def phases():
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    returned = time.perf_counter()
    torch.cuda.current_stream().synchronize()
    drained = time.perf_counter()
    loss.backward()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    done = time.perf_counter()
    return returned - start, drained - start, done - drained


def allocator():
    s = torch.cuda.memory_stats()
    return s.get("num_device_alloc", 0), s.get("num_alloc_retries", 0)


print(json.dumps({"cpus": len(os.sched_getaffinity(0)), "cpu.max": open("/sys/fs/cgroup/cpu.max").read().strip()
                  if os.path.exists("/sys/fs/cgroup/cpu.max") else None}), flush=True)
rows = {v: {"step": [], "fwd_host": [], "fwd": [], "bwd": []} for v in VARIANTS}
extra = {}
for r in range(rounds):
    for name, enable in VARIANTS.items():
        handle = enable()
        if name.endswith("_nogc"):
            gc.disable()
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        if handle is not None:
            handle.manager.reset_stats()
        before = allocator()
        for _ in range(5):
            torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            rows[name]["step"].append(time.perf_counter() - t)
        after = allocator()
        for _ in range(5):
            fh, f, b = phases()
            rows[name]["fwd_host"].append(fh)
            rows[name]["fwd"].append(f)
            rows[name]["bwd"].append(b)
        extra[name] = {"device_allocs_per_step": (after[0] - before[0]) / 5, "alloc_retries": after[1] - before[1]}
        if handle is not None:
            s = handle.stats()
            extra[name].update({k: s.get(k) for k in ("host_wait_ms", "compute_wait_ms", "pool_misses", "host_allocations")})
            handle.manager.empty_pool()
            handle.remove()
        gc.enable()
    print(json.dumps({"round": r, **{v: [round(x * 1e3, 1) for x in t["step"][-5:]] for v, t in rows.items()}}),
          flush=True)

summary = {v: {**{k: round(statistics.median(x) * 1e3, 2) for k, x in t.items()}, **extra[v]} for v, t in rows.items()}
print(json.dumps({"seq": seq, "rounds": rounds, "ms": summary}, indent=1), flush=True)
