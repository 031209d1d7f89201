"""Does a 4k `modules` step (issue 13) settle only after several steps? Each round applies the mode
afresh (as bench_modules.py does per variant) and times STEPS steps one by one, with the manager's
counters per step: compute-stream wait on copies, host wait on the in-flight bound, host pool
misses and allocations. Plain training runs beside it in the same rounds.

python3 benchmarks/results/modules_warmup_4k.py [SEQ] [ROUNDS] [STEPS]"""
import json
import sys
import time
import warnings

import torch

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from benchmarks.common import reference_from_argv  # noqa: E402

warnings.simplefilter("ignore", torch_offload.NothingOffloadedWarning)
seq, rounds, model, ids = reference_from_argv(4096, 2)
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
COUNTERS = ("compute_wait_ms", "host_wait_ms", "pool_misses", "host_allocations")


def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


for r in range(rounds):
    for name in ("none", "modules"):
        handle = torch_offload.apply(model, "modules", targets=["*.self_attn"]) if name == "modules" else None
        times, per_step = [], []
        before = dict.fromkeys(COUNTERS, 0.0)
        for _ in range(steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(round((time.perf_counter() - start) * 1e3, 1))
            if handle is not None:
                stats = handle.stats()
                per_step.append({k: round(stats[k] - before[k], 2) for k in COUNTERS})
                before = {k: stats[k] for k in COUNTERS}
        print(json.dumps({"round": r, "variant": name, "step_ms": times, "per_step": per_step}), flush=True)
        if handle is not None:
            handle.remove()
