#!/usr/bin/env python3
"""Where the time of a short training step goes, per variant (GPU only): the median step time over 7
steps, then one profiled step: kernel time per CUDA stream, copy time, the CUDA runtime calls that
took longest, the compute stream's idle time and longest gaps, the top CPU ops by self time. Writes
profile_SEQ.json and one Chrome trace per variant (trace_VARIANT.json, for Perfetto or
chrome://tracing) to --out (without --out, a new temporary folder).

Variants: none (plain training), ckpt (torch's non-reentrant checkpointing), any apply() mode name
(hidden_states, selective, ...), MODE_re (the mode with use_reentrant=True), selective_per_op (the
"attention" policy given as a per-op function), modules (mode "modules", targets *.self_attn).

    python3 benchmarks/profile_short_step.py --out DIR --seq 4096

At 4k the reference model's step is bound by the host (docs/performance.md, "modules"): what each
variant adds on the host threads is what it costs there; the kernel time per stream tells that the
GPU's work is the same.
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
from torch_offload import policies  # noqa: E402
from benchmarks.common import (REFERENCE, add_out_arg, build_llama, output_dir, release_memory,  # noqa: E402
                               trace_summary)


def enable(model, variant):
    """Turns `variant` on; returns what undoes it."""
    if variant == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model.gradient_checkpointing_disable
    if variant == "none":
        return lambda: None
    if variant == "selective_per_op":
        return torch_offload.apply(model, "selective", policy=policies.attention).remove
    if variant == "modules":
        return torch_offload.apply(model, "modules", targets=["*.self_attn"]).remove
    if variant.endswith("_re"):  # the reentrant variant of a mode (hidden_states_re, selective_re)
        return torch_offload.apply(model, variant[:-3], use_reentrant=True).remove
    return torch_offload.apply(model, variant).remove


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out_arg(p)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--variants", default="none,ckpt,hidden_states,selective,selective_per_op,modules")
    args = p.parse_args()
    out = output_dir(args, prefix="torch_offload_profile_")
    model = build_llama(REFERENCE, "cuda", args.seq)
    ids = torch.randint(0, REFERENCE["vocab"], (1, args.seq), device="cuda")

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    results = {}
    for variant in args.variants.split(","):
        undo = enable(model, variant)
        try:
            for _ in range(2):
                step()
            times = []
            for _ in range(7):
                torch.cuda.synchronize()
                t = time.perf_counter()
                step()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                t = time.perf_counter()
                step()
                torch.cuda.synchronize()
                wall = time.perf_counter() - t
            trace = out / f"trace_{variant}.json"
            prof.export_chrome_trace(str(trace))
            r = {"median_step_s": statistics.median(times), "times": times, "profiled_wall_s": wall,
                 **trace_summary(trace), "peak_GB": torch.cuda.max_memory_allocated() / 2**30}
            results[variant] = r
            print(f"=== {variant}: median {r['median_step_s'] * 1e3:.1f} ms, profiled {wall * 1e3:.1f} ms, "
                  f"kernel span {r['kernel_span_ms']:.1f} ms")
            print("  kernel busy per stream ms:", {k: round(x, 1) for k, x in r["kernel_busy_ms_per_stream"].items()})
            print("  copies ms:", {k: round(x, 1) for k, x in r["copies_ms"].items()})
            print(f"  compute stream idle {r.get('compute_idle_ms', 0.0):.1f} ms; largest gaps:",
                  [(round(g["ms"], 2), g["after"][:30], g["before"][:30]) for g in r.get("largest_gaps", [])])
            print("  runtime top:", {k: (x["count"], round(x["ms"], 1)) for k, x in r["runtime_top"].items()})
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60),
                  flush=True)
        finally:
            undo()
            release_memory("cuda")
    base = results.get("ckpt", {}).get("median_step_s")
    for variant, r in results.items():
        ratio = base / r["median_step_s"] if base else float("nan")
        print(f"{variant:18s} {r['median_step_s'] * 1e3:8.1f} ms  x ckpt {ratio:.3f}")
    (out / f"profile_{args.seq}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
