#!/usr/bin/env python3
"""Benchmark of modules mode (selective activation offload) on the reference model (random-init
LlamaForCausalLM 1.26B, bf16, SDPA, batch 1, no checkpointing), in one process.

Per sequence length and variant (no offloading; modules mode with each --targets set, whose
entries are fnmatch patterns or presets written preset:NAME):
  - median step time (whole training steps, as a training loop runs them: nothing synchronised
    between forward and backward) and tokens/s; peak allocated / reserved GPU memory over them;
    with --rounds N the variants run N times interleaved and the round with the median step counts
    (every round in the JSON's round_runs);
  - the forward's host time (median): where no offloading's is near its forward's GPU time, the
    step is host-bound and a mode's ratio follows the host's speed (docs/performance.md, "modules");
  - then one more step, not timed, whose forward ends with the copies finished (handle.report()):
    GPU memory allocated at the end of forward (before backward), and its drop against no
    offloading: the bytes the device really got back;
  - the handle's report for that forward: expected_bytes (distinct storages offloaded) and
    freed_bytes (those the device no longer holds once the copies finished).
The timed steps do not wait for the copies after forward: backward overlaps the forward's last
copies, as in training.
Targets: freed >= 97% of expected; step time within 3% of no offloading where the transfer fits
behind compute (bytes offloaded / pinned D2H bandwidth below the forward time).

Writes <out>/modules_<gpu>.json and .md (without --out, into a new temporary folder).

GPU:       python3 benchmarks/bench_modules.py --out DIR
CPU smoke: python benchmarks/bench_modules.py --device cpu --tiny --out DIR
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from benchmarks.common import (GB, REFERENCE, add_run_args, build_llama, finish_run_args, log,  # noqa: E402
                               median_rounds, new_result, output_dir, release_memory, short_gpu_name, sync, table)


def run_variant(model, targets, seq, args, keep_gb=0.0, prefetch_depth=None):
    # "preset:NAME" in a --targets set is the preset NAME (presets=), the rest are patterns
    presets = [t[len("preset:"):] for t in targets or () if t.startswith("preset:")]
    patterns = [t for t in targets or () if not t.startswith("preset:")]
    options = dict(keep_on_device_bytes=int(keep_gb * GB)) if keep_gb else {}
    if prefetch_depth is not None:
        options["prefetch_depth"] = prefetch_depth
    handle = torch_offload.apply(model, "modules", targets=patterns, presets=presets,
                                 min_bytes=args.min_bytes, **options) if targets else None
    ids = torch.randint(0, args.config["vocab"], (1, seq), device=args.device)
    label = "none" if not targets else ("modules " + ",".join(targets) + (f" keep {keep_gb:g} GB" if keep_gb else "")
                                        + (f" prefetch {prefetch_depth}" if prefetch_depth is not None else ""))
    try:
        for _ in range(args.warmup):
            model(input_ids=ids, labels=ids).loss.backward()
            model.zero_grad(set_to_none=True)
        sync(args.device)
        if handle is not None:
            handle.manager.synchronize()
            handle.manager.reset_stats()
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times, forward_host = [], []
        for _ in range(args.steps):
            sync(args.device)
            t = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            forward_host.append(time.perf_counter() - t)
            loss.backward()
            del loss
            model.zero_grad(set_to_none=True)
            sync(args.device)
            times.append(time.perf_counter() - t)
        row = {"variant": label, "seq": seq, "step_s": statistics.median(times), "times_s": times,
               "forward_host_ms": statistics.median(forward_host) * 1e3}
        row["tokens_per_s"] = seq / row["step_s"]
        if args.device == "cuda":
            row["peak_allocated_GB"] = torch.cuda.max_memory_allocated() / GB
            row["peak_reserved_GB"] = torch.cuda.max_memory_reserved() / GB
        if handle is not None:
            row["stats"] = handle.stats()
            row["d2h_GB_per_step"] = row["stats"]["bytes_to_host"] / args.steps / GB
        # The memory step: its forward ends once the copies have finished.
        loss = model(input_ids=ids, labels=ids).loss
        if handle is not None:
            row["report"] = handle.report()  # waits for the copies
        sync(args.device)
        if args.device == "cuda":
            row["allocated_after_forward_GB"] = torch.cuda.memory_allocated() / GB
        loss.backward()
        model.zero_grad(set_to_none=True)
        del loss
        return row
    except torch.cuda.OutOfMemoryError:
        return {"variant": label, "seq": seq, "error": "OOM"}
    finally:
        if handle is not None:
            handle.manager.empty_pool()
            handle.remove()
        release_memory(args.device)


def evaluate(runs):
    none = {r["seq"]: r for r in runs if r["variant"] == "none" and "error" not in r}
    for r in runs:
        if r["variant"] == "none" or "error" in r:
            continue
        rep = r["report"]
        r["expected_GB"], r["freed_GB"] = rep["expected_bytes"] / GB, rep["freed_bytes"] / GB
        r["freed_over_expected"] = rep["freed_bytes"] / rep["expected_bytes"] if rep["expected_bytes"] else None
        base = none.get(r["seq"])
        if base:
            r["step_ratio_to_none"] = r["step_s"] / base["step_s"]
            if "allocated_after_forward_GB" in r:
                r["device_drop_GB"] = base["allocated_after_forward_GB"] - r["allocated_after_forward_GB"]
                r["device_drop_over_expected"] = r["device_drop_GB"] * GB / rep["expected_bytes"] if rep["expected_bytes"] else None


def markdown(result):
    lines = [f"# modules mode on {result['gpu']}", "", f"command: `{result['command']}`", ""]
    lines += table(result["runs"], [
        ("step s", "step_s", "{:.3f}"), ("step / none", "step_ratio_to_none", "{:.3f}"),
        ("fwd host ms", "forward_host_ms", "{:.1f}"),
        ("peak alloc GB", "peak_allocated_GB", "{:.2f}"), ("alloc after fwd GB", "allocated_after_forward_GB", "{:.2f}"),
        ("drop vs none GB", "device_drop_GB", "{:.2f}"), ("expected GB", "expected_GB", "{:.2f}"),
        ("freed GB", "freed_GB", "{:.2f}"), ("freed / expected", "freed_over_expected", "{:.3f}"),
        ("D2H GB/step", "d2h_GB_per_step", "{:.2f}")])
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # 5 warm-up steps per variant: the steps right after apply() run slower (the first fills the
    # pinned pool), and each round applies the mode afresh.
    add_run_args(p, seqs="4096,16384", steps=4, warmup=5)
    p.add_argument("--targets", action="append",
                   help="comma-separated patterns and preset:NAME (preset:qkv,preset:core_attn), one set "
                        "per flag (default: *.self_attn)")
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--rounds", type=int, default=1, help="run the variants this many times, interleaved")
    p.add_argument("--keep-gb", default="0",
                   help="comma-separated keep_on_device_bytes in GB: each target set runs with each (0: none kept)")
    p.add_argument("--prefetch-depths", default="",
                   help="comma-separated prefetch_depth values: each target set runs with each (default: the mode's)")
    args = finish_run_args(p.parse_args(), REFERENCE)
    if args.tiny:
        args.min_bytes = 0
    target_sets = [t.split(",") for t in (args.targets or ["*.self_attn"])]

    result = new_result(args)
    name = short_gpu_name(args.device)
    out = output_dir(args)
    model = build_llama(args.config, args.device, max(args.seq_list))

    t0 = time.time()
    keeps = [float(k) for k in args.keep_gb.split(",")]
    depths = [int(d) for d in args.prefetch_depths.split(",")] if args.prefetch_depths else [None]
    variants = [(None, 0.0, None)] + [(t, k, d) for t in target_sets for k in keeps for d in depths]
    result["round_runs"] = []  # every round's row; "runs" holds the median round of each
    for seq in args.seq_list:
        for _ in range(args.rounds):
            for targets, keep_gb, depth in variants:
                row = run_variant(model, targets, seq, args, keep_gb, depth)
                log({k: v for k, v in row.items() if k not in ("stats", "times_s")}, f"{time.time() - t0:.0f}s")
                result["round_runs"].append(row)
            result["runs"] = median_rounds(result["round_runs"])
            evaluate(result["runs"])
            (out / f"modules_{name}.json").write_text(json.dumps(result, indent=1))
            (out / f"modules_{name}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
