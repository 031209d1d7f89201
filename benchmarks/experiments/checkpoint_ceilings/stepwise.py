#!/usr/bin/env python3
"""hidden_states and selective against torch's checkpointing and against what bounds them, step by
step in one process (GPU only).

Each variant runs on its own copy of the reference model (same weights, applied once), one step at
a time with the order rotating, so that nothing is applied or removed between steps and the host's
speed and the GPU's clocks, which drift, are shared by each set of steps.

VARIANTS (comma-separated):
  ckpt, ckpt_re    torch's checkpointing (gradient_checkpointing_enable), non-reentrant / reentrant
  torch_sac        torch's selective checkpointing keeping the attention outputs on the GPU: what the
                   "attention" policy gives with no copy at all
  hidden, hidden_re, selective, selective_re
                   apply(model, "hidden_states") / apply(model, "selective", policy="attention"),
                   _re: use_reentrant=True
  hidden_nocopy    hidden_states with every block input kept on the GPU, uncopied: checkpointing's
                   GPU work through our checkpoint
  VARIANT@GB       an offloading variant with keep_on_device_bytes=GB*1e9 (the newest saves stay on
                   the GPU)
  plain            plain training (no checkpointing)
Per variant: the median step, its peak allocated memory (every copy's weights included, so compare
peaks within one run), and the median and mean over the sets of checkpointing's step / the variant's
(>1: faster than checkpointing); with "plain", the variant's step / plain training's (>1: slower);
each variant's 10th / 90th percentile and slowest step, and the time Python's garbage collector ran
in its steps. STEPWISE_GC_FREEZE=1 freezes every object made before the timed steps (gc.freeze()).

    python3 benchmarks/experiments/checkpoint_ceilings/stepwise.py [SEQ] [SETS] [VARIANTS]
    python3 benchmarks/experiments/checkpoint_ceilings/stepwise.py 16384 16 ckpt,torch_sac,selective,hidden,hidden_nocopy
"""
import copy
import functools
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch_offload  # noqa: E402
from torch_offload import policies  # noqa: E402
from benchmarks.common import GB, REFERENCE, build_llama  # noqa: E402


def enable(model, variant):
    """Turns `variant` on for good on this copy of the model."""
    name, at, gb = variant.partition("@")
    if name in ("ckpt", "ckpt_re"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": name == "ckpt_re"})
    elif name == "torch_sac":
        context_fn = functools.partial(create_selective_checkpoint_contexts, policies.attention_save)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False,
                                                                           "context_fn": context_fn})
    elif name in ("hidden", "hidden_re", "selective", "selective_re", "hidden_nocopy"):
        options = {"policy": "attention"} if name.startswith("selective") else {}
        if at:
            options["keep_on_device_bytes"] = int(float(gb) * GB)
        if name == "hidden_nocopy":
            options["keep_on_device_bytes"] = 10 ** 12
        if name.endswith("_re"):
            options["use_reentrant"] = True
        torch_offload.apply(model, "selective" if name.startswith("selective") else "hidden_states", **options)
    elif name != "plain":
        raise SystemExit(f"unknown variant {variant!r}")
    if at and not name.startswith(("hidden", "selective")):
        raise SystemExit(f"{variant!r}: @GB needs an offloading variant")


def step(model, ids):
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - t0) * 1e3
    model.zero_grad(set_to_none=True)  # between steps only the copies' weights stay
    return elapsed, torch.cuda.max_memory_allocated() / GB


def main():
    seq = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
    sets = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    variants = (sys.argv[3] if len(sys.argv) > 3 else "ckpt,hidden,selective").split(",")
    base = build_llama(REFERENCE, "cuda", seq)
    ids = torch.randint(0, REFERENCE["vocab"], (1, seq), device="cuda")
    models = {}
    for v in variants:
        models[v] = copy.deepcopy(base)
        enable(models[v], v)
    resident = sum(p.numel() * p.element_size() for p in base.parameters()) / GB
    del base

    gc_ms, gc_start = [0.0], [0.0]  # the collector's time since the counter was last reset

    def on_gc(phase, info):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_ms[0] += (time.perf_counter() - gc_start[0]) * 1e3

    for i in range(2 * len(variants)):  # warm-up
        step(models[variants[i % len(variants)]], ids)
    freeze = os.environ.get("STEPWISE_GC_FREEZE") == "1"
    if freeze:
        gc.collect()
        gc.freeze()
    gc.callbacks.append(on_gc)
    times = {v: [] for v in variants}
    gc_times = {v: [] for v in variants}
    peaks = {v: 0.0 for v in variants}
    for i in range(sets):
        shift = i % len(variants)
        for v in variants[shift:] + variants[:shift]:
            gc_ms[0] = 0.0
            ms, peak = step(models[v], ids)
            times[v].append(ms)
            gc_times[v].append(gc_ms[0])
            peaks[v] = max(peaks[v], peak)
    gc.callbacks.remove(on_gc)

    print(f"seq {seq}, {sets} sets of one step per variant (order rotating), {len(variants)} model copies "
          f"(peaks include every copy's weights: {resident:.2f} GB each); medians in ms")
    for v in variants:
        extra = ""
        if "ckpt" in times and v != "ckpt":
            speed = [c / t for c, t in zip(times["ckpt"], times[v])]
            extra += f"  ckpt / variant: median {statistics.median(speed):.4f}x, mean {statistics.mean(speed):.4f}x"
        if "plain" in times and v != "plain":
            slower = [t / p for p, t in zip(times["plain"], times[v])]
            extra += f"  variant / plain: median {statistics.median(slower):.4f}x, mean {statistics.mean(slower):.4f}x"
        print(f"{v:15s} {statistics.median(times[v]):8.1f} ms  peak {peaks[v]:6.2f} GB{extra}")
    for v in variants:
        if len(times[v]) < 2:
            continue
        deciles = statistics.quantiles(times[v], n=10)
        collected = sum(1 for t in gc_times[v] if t > 0)
        print(f"{v:15s} p10 {deciles[0]:.1f}  p90 {deciles[-1]:.1f}  slowest {max(times[v]):.1f} ms; "
              f"garbage collector {statistics.mean(gc_times[v]):.2f} ms per step, in {collected} of "
              f"{len(gc_times[v])} steps{' (gc.freeze)' if freeze else ''}")


if __name__ == "__main__":
    main()
