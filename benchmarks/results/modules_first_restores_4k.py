"""Issue 13 (session 17): modules `*.self_attn` with backward's first restores (the last selected
module's saves) started during the LM head's backward, against the same handle with that hook idle,
and against no save hooks in the selected modules ("none": plain training plus the module hooks'
own cost), alternated step by step in one process so that the host's drifting speed is shared by
each triple. Per variant: the step, the compute stream's wait for restores, prefetch hits per
restore; medians and the median of the paired differences.

    python3 benchmarks/results/modules_first_restores_4k.py [SEQ] [SETS] [VARIANTS]

VARIANTS (comma-separated, default first,nofirst,none): "first" as applied, "nofirst" without the
first restores' prefetch, "nobatch" with each copy issued on its own (batch_copies off; from commit
after 04ebaaf, where modules mode batches each selected call's copies), "nocopy" every save kept on
the GPU uncopied (the manager's keep_on_device_bytes window set above every step's saves for the
step), "none" no save hooks. "first@N"
is "first" with TORCH_OFFLOAD_EXP_BATCH=N set for its steps (a library built with
session17_batch_emulation.patch: the side-stream wait and done event issued once per N copies).
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from no_save_hooks import NoSaveHooks  # beside this script
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


_NoSaveHooks = NoSaveHooks  # no_save_hooks.py


BATCHES = getattr(offload_hooks, "batch_copies", False)  # as applied (False before batching existed)
KINDS = {"first": (offload_hooks, depth, True), "nofirst": (offload_hooks, 0, True),
         "nobatch": (offload_hooks, depth, False), "none": (_NoSaveHooks(), 0, False),
         "nocopy": (offload_hooks, depth, True)}
VARIANTS = (sys.argv[3] if len(sys.argv) > 3 else "first,nofirst,none").split(",")
rows = {name: {"step": [], "wait": [], "hits": [], "forward": [], "batches": []} for name in VARIANTS}


def step(name):
    kind, _, batch = name.partition("@")
    if batch:
        os.environ["TORCH_OFFLOAD_EXP_BATCH"] = batch
    else:
        os.environ.pop("TORCH_OFFLOAD_EXP_BATCH", None)
    modules.hooks, first.count, batch = KINDS[kind]
    offload_hooks.batch_copies = batch and BATCHES
    handle.manager.set_keep_on_device_bytes(10 ** 12 if kind == "nocopy" else 0)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = handle.stats()
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    forward = (time.perf_counter() - t0) * 1e3  # host time until the loss is returned
    loss.backward()
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - t0) * 1e3
    handle.manager.synchronize()
    after = handle.stats()
    restores = after["restores"] - before["restores"]
    hits = (after["prefetch_hits"] - before["prefetch_hits"]) / restores if restores else float("nan")
    batches = after.get("copy_batches", 0) - before.get("copy_batches", 0)
    return elapsed, after["compute_wait_ms"] - before["compute_wait_ms"], hits, forward, batches


NAMES = VARIANTS
for i in range(2 * len(NAMES)):
    step(NAMES[i % len(NAMES)])
for i in range(sets):
    shift = i % len(NAMES)
    for name in NAMES[shift:] + NAMES[:shift]:  # each variant at each place in turn
        for key, value in zip(("step", "wait", "hits", "forward", "batches"), step(name)):
            rows[name][key].append(value)
print(f"seq {seq}, {sets} sets of steps rotating the variants; medians (ms)")
for name, row in rows.items():
    print(f"{name:8s} step {statistics.median(row['step']):6.1f}  host forward {statistics.median(row['forward']):5.1f}  compute wait {statistics.median(row['wait']):5.2f}"
          f"  prefetch hits / restores {statistics.median(row['hits']):.3f}  copy batches {statistics.median(row['batches']):.0f}")
for a, b in [(a, b) for a in NAMES for b in NAMES if a < b]:
    for key in ("step", "forward"):
        diffs = [x - y for x, y in zip(rows[a][key], rows[b][key])]
        print(f"{a} - {b}, {key}: median {statistics.median(diffs):+.2f} ms, mean {statistics.mean(diffs):+.2f} ms; "
              f"ratio of medians {statistics.median(rows[a][key]) / statistics.median(rows[b][key]):.4f}")
