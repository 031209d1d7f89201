#!/usr/bin/env python3
"""Where the 4k modules step's extra time goes, step by step in one process (GPU only).

Variants (comma-separated), each on its own copy of the reference model (same weights, applied
once), stepped one at a time with the order rotating, so that the host's speed and the GPU's clocks,
which drift, are shared by each set of steps:
  plain          plain training (no checkpointing, no offloading)
  modules        apply(model, "modules", targets=["*.self_attn"])
  modules_keep   the same with min_bytes=2**62: every save goes through the hooks and the engine's
                 filter and stays on the GPU (what the hooks cost without a copy)
  modules_mifN   modules with max_in_flight=N (0: copies in flight unbounded)
Every copy gets the same timing hooks: a perf_counter_ns read at each decoder layer's and each
self_attn's entry and exit (the entry hook runs first and the exit hook last, so a self_attn span
includes modules mode's own module hooks and its batch of copies). Per step: the forward's host time
split into the self_attn calls (attn), the rest of the decoder layers (layer_rest) and the forward
outside the layers (outside); the forward's end on the GPU (fwd_gpu, CUDA events); backward's host
time (until backward() returns) and the tail until the GPU finishes; the step. Printed: medians per
variant, the median of the per-set differences against plain training, and each variant's step /
plain training's (>1: slower).

    python3 benchmarks/experiments/modules_4k_host_bound/host_split.py [SEQ] [SETS] [VARIANTS]
    python3 benchmarks/experiments/modules_4k_host_bound/host_split.py 4096 60 plain,modules_keep,modules

HOST_SPLIT_GC=off runs every variant with Python's garbage collector disabled once the models are
built; =freeze freezes the objects that exist then (gc.freeze()).
"""
import copy
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch_offload  # noqa: E402
from benchmarks.common import REFERENCE, build_llama  # noqa: E402

marks = []  # (kind, edge, ns) of the running step: kind "attn" or "layer", edge 0 entry / 1 exit


def build_variants(variants, seq):
    base = build_llama(REFERENCE, "cuda", seq)
    models = {}
    for v in variants:
        model = copy.deepcopy(base)
        if v != "plain":
            options = {"min_bytes": 1 << 62} if v == "modules_keep" else {}
            if v.startswith("modules_mif"):
                options["max_in_flight"] = int(v[len("modules_mif"):])
            elif v not in ("modules", "modules_keep"):
                raise SystemExit(f"unknown variant {v!r}: plain, modules, modules_keep or modules_mifN")
            torch_offload.apply(model, "modules", targets=["*.self_attn"], **options)
        layer_names = tuple(f"layers.{i}" for i in range(REFERENCE["layers"]))
        for name, module in model.named_modules():
            if name.endswith("self_attn") or name.endswith(layer_names):
                kind = "attn" if name.endswith("self_attn") else "layer"
                module.register_forward_pre_hook(
                    lambda m, a, kind=kind: marks.append((kind, 0, time.perf_counter_ns())), prepend=True)
                module.register_forward_hook(
                    lambda m, a, o, kind=kind: marks.append((kind, 1, time.perf_counter_ns())))
        models[v] = model
    return models


def spans(kind):
    """Host ms inside the calls of `kind` during the running step."""
    total, start = 0, None
    for k, edge, ns in marks:
        if k == kind:
            if edge == 0:
                start = ns
            else:
                total += ns - start
    return total / 1e6


def step(model, ids):
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    marks.clear()
    begin, forward_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter_ns()
    begin.record()
    loss = model(input_ids=ids, labels=ids).loss
    forward_end.record()
    t1 = time.perf_counter_ns()
    loss.backward()
    t2 = time.perf_counter_ns()
    torch.cuda.synchronize()
    t3 = time.perf_counter_ns()
    attn, layers = spans("attn"), spans("layer")
    forward = (t1 - t0) / 1e6
    return {"step": (t3 - t0) / 1e6, "fwd_host": forward, "attn": attn, "layer_rest": layers - attn,
            "outside": forward - layers, "fwd_gpu": begin.elapsed_time(forward_end),
            "bwd_host": (t2 - t1) / 1e6, "bwd_tail": (t3 - t2) / 1e6}


def main():
    seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    sets = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    variants = (sys.argv[3] if len(sys.argv) > 3 else "plain,modules_keep,modules").split(",")
    models = build_variants(variants, seq)
    ids = torch.randint(0, REFERENCE["vocab"], (1, seq), device="cuda")
    gc_mode = os.environ.get("HOST_SPLIT_GC", "on")
    if gc_mode == "off":
        gc.disable()
    elif gc_mode == "freeze":
        gc.collect()
        gc.freeze()
    print("garbage collector:", gc_mode, flush=True)

    for i in range(2 * len(variants)):  # warm-up: the first steps fill the pinned pool and the caches
        step(models[variants[i % len(variants)]], ids)
    rows = {v: [] for v in variants}
    for i in range(sets):
        shift = i % len(variants)
        for v in variants[shift:] + variants[:shift]:
            rows[v].append(step(models[v], ids))

    keys = list(rows[variants[0]][0])
    print(f"seq {seq}, {sets} sets, medians in ms (attn: the self_attn calls' host time; layer_rest: the "
          f"rest of the decoder layers; outside: the forward outside the layers; fwd_gpu: the forward's end "
          f"on the GPU; bwd_host: until backward() returned; bwd_tail: then until the GPU finished)")
    print(f"{'variant':14s}" + "".join(f"{k:>11s}" for k in keys))
    for v in variants:
        print(f"{v:14s}" + "".join(f"{statistics.median(r[k] for r in rows[v]):11.2f}" for k in keys))
    if "plain" in rows:
        print("median of per-set differences against plain")
        for v in variants:
            if v != "plain":
                print(f"{v:14s}" + "".join(
                    f"{statistics.median(a[k] - p[k] for a, p in zip(rows[v], rows['plain'])):11.2f}" for k in keys))
        for v in variants:
            if v != "plain":
                ratio = statistics.median(a["step"] / p["step"] for a, p in zip(rows[v], rows["plain"]))
                print(f"{v}: step / plain median {ratio:.4f}x")


if __name__ == "__main__":
    main()
