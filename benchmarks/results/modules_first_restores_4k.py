"""Issue 13 (session 17): modules `*.self_attn` with backward's first restores (the last selected
module's saves) started during the LM head's backward, against the same handle with that hook idle,
and against no save hooks in the selected modules ("none": plain training plus the module hooks'
own cost), alternated step by step in one process so that the host's drifting speed is shared by
each triple. Per variant: the step, the compute stream's wait for restores, prefetch hits per
restore; medians and the median of the paired differences.

    python3 benchmarks/results/modules_first_restores_4k.py [SEQ] [SETS]
"""
import os, statistics, sys, time, types
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama
from torch_offload.first_restores import PrefetchFirstRestores

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
sets = int(sys.argv[2]) if len(sys.argv) > 2 else 40
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
handle = torch_offload.apply(model, "modules", targets=["*.self_attn"])
modules = handle.modules
(first,) = [h for h in model.lm_head._forward_hooks.values() if isinstance(h, PrefetchFirstRestores)]
depth = first.count
offload_hooks = modules.hooks


class _NoSaveHooks:
    """Entered by the module hooks like saved-tensor hooks, but installs none."""
    filter = types.SimpleNamespace(reset_record=lambda: None)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


VARIANTS = {"first": (offload_hooks, depth), "nofirst": (offload_hooks, 0), "none": (_NoSaveHooks(), 0)}
rows = {name: {"step": [], "wait": [], "hits": []} for name in VARIANTS}


def step(name):
    modules.hooks, first.count = VARIANTS[name]
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = handle.stats()
    t0 = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - t0) * 1e3
    handle.manager.synchronize()
    after = handle.stats()
    restores = after["restores"] - before["restores"]
    hits = (after["prefetch_hits"] - before["prefetch_hits"]) / restores if restores else float("nan")
    return elapsed, after["compute_wait_ms"] - before["compute_wait_ms"], hits


NAMES = list(VARIANTS)
for i in range(2 * len(NAMES)):
    step(NAMES[i % len(NAMES)])
for i in range(sets):
    shift = i % len(NAMES)
    for name in NAMES[shift:] + NAMES[:shift]:  # each variant at each place in turn
        for key, value in zip(("step", "wait", "hits"), step(name)):
            rows[name][key].append(value)
print(f"seq {seq}, {sets} sets of steps rotating the variants; medians (ms)")
for name, row in rows.items():
    print(f"{name:8s} step {statistics.median(row['step']):6.1f}  compute wait {statistics.median(row['wait']):5.2f}"
          f"  prefetch hits / restores {statistics.median(row['hits']):.3f}")
for a, b in (("nofirst", "first"), ("first", "none"), ("nofirst", "none")):
    diffs = [x - y for x, y in zip(rows[a]["step"], rows[b]["step"])]
    print(f"{a} - {b}, step: median {statistics.median(diffs):+.2f} ms, mean {statistics.mean(diffs):+.2f} ms; "
          f"ratio of medians {statistics.median(rows[a]['step']) / statistics.median(rows[b]['step']):.4f}")
