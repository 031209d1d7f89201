#!/usr/bin/env python3
"""Benchmark of modules mode (selective activation offload) on the reference model of DESIGN.md
(random-init LlamaForCausalLM 1.26B, bf16, SDPA, batch 1, no checkpointing), in one process.

Per sequence length and variant (no offloading; modules mode with each --targets set):
  - median step time and tokens/s; peak allocated / reserved GPU memory;
  - GPU memory allocated at the end of forward (before backward), and its drop against no
    offloading: the bytes the device really got back;
  - the handle's report for that forward: expected_bytes (distinct storages offloaded) and
    freed_bytes (those the device no longer holds once the copies finished).
Targets: freed >= 97% of expected; step time within 3% of no offloading where the transfer fits
behind compute (bytes offloaded / pinned D2H bandwidth below the forward time).

GPU:       python3 benchmarks/bench_modules.py --out DIR
CPU smoke: python benchmarks/bench_modules.py --device cpu --tiny
"""
import argparse
import datetime
import gc
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from benchmarks.common import GB, REFERENCE, TINY, build_llama, gpu_name, log, short_gpu_name, sync  # noqa: E402

def run_variant(model, targets, seq, args):
    handle = torch_offload.apply(model, "modules", targets=targets, min_bytes=args.min_bytes) if targets else None
    ids = torch.randint(0, args.config["vocab"], (1, seq), device=args.device)
    label = "none" if not targets else "modules " + ",".join(targets)
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
        times, after_forward = [], []
        for _ in range(args.steps):
            sync(args.device)
            t = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            if handle is not None:
                report = handle.report()  # synchronizes the copies: outside the timed region
            sync(args.device)
            forward_s = time.perf_counter() - t
            if args.device == "cuda":
                after_forward.append(torch.cuda.memory_allocated() / GB)
            t2 = time.perf_counter()
            loss.backward()
            model.zero_grad(set_to_none=True)
            sync(args.device)
            times.append(forward_s + time.perf_counter() - t2)
            del loss
        row = {"variant": label, "seq": seq, "step_s": statistics.median(times), "times_s": times}
        row["tokens_per_s"] = seq / row["step_s"]
        if args.device == "cuda":
            row["peak_allocated_GB"] = torch.cuda.max_memory_allocated() / GB
            row["peak_reserved_GB"] = torch.cuda.max_memory_reserved() / GB
            row["allocated_after_forward_GB"] = statistics.median(after_forward)
        if handle is not None:
            row["report"] = report
            row["stats"] = handle.stats()
            row["d2h_GB_per_step"] = row["stats"]["bytes_to_host"] / args.steps / GB
        return row
    except torch.cuda.OutOfMemoryError:
        return {"variant": label, "seq": seq, "error": "OOM"}
    finally:
        if handle is not None:
            handle.manager.empty_pool()
            handle.remove()
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()


def evaluate(runs):
    none = {r["seq"]: r for r in runs if r["variant"] == "none" and "error" not in r}
    for r in runs:
        if r["variant"] == "none" or "error" in r:
            continue
        rep = r["report"]
        r["freed_over_expected"] = rep["freed_bytes"] / rep["expected_bytes"] if rep["expected_bytes"] else None
        base = none.get(r["seq"])
        if base:
            r["step_ratio_to_none"] = r["step_s"] / base["step_s"]
            if "allocated_after_forward_GB" in r:
                r["device_drop_GB"] = base["allocated_after_forward_GB"] - r["allocated_after_forward_GB"]
                r["device_drop_over_expected"] = r["device_drop_GB"] * GB / rep["expected_bytes"] if rep["expected_bytes"] else None


def markdown(result):
    lines = [f"# modules mode on {result['gpu']}", "", f"command: `{result['command']}`", "",
             "| seq | variant | step s | step / none | peak alloc GB | alloc after fwd GB | drop vs none GB | "
             "expected GB | freed GB | freed / expected | D2H GB/step |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        if "error" in r:
            lines.append(f"| {r['seq']} | {r['variant']} | {r['error']} |" + " |" * 9)
            continue
        f = lambda k, fmt="{:.2f}": fmt.format(r[k]) if r.get(k) is not None else "-"  # noqa: E731
        rep = r.get("report", {})
        exp = f"{rep['expected_bytes'] / GB:.2f}" if rep else "-"
        freed = f"{rep['freed_bytes'] / GB:.2f}" if rep else "-"
        lines.append(f"| {r['seq']} | {r['variant']} | {f('step_s', '{:.3f}')} | {f('step_ratio_to_none', '{:.3f}')} | "
                     f"{f('peak_allocated_GB')} | {f('allocated_after_forward_GB')} | {f('device_drop_GB')} | "
                     f"{exp} | {freed} | {f('freed_over_expected', '{:.3f}')} | {f('d2h_GB_per_step')} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", default="4096,16384")
    p.add_argument("--targets", action="append",
                   help="comma-separated patterns, one set per flag (default: *.self_attn)")
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    args.config = TINY if args.tiny else REFERENCE
    if args.tiny:
        args.min_bytes = 0
        if "--seqs" not in sys.argv:
            args.seqs = "64,128"
    args.seq_list = [int(s) for s in args.seqs.split(",")]
    target_sets = [t.split(",") for t in (args.targets or ["*.self_attn"])]

    result = {"command": " ".join(shlex.quote(a) for a in sys.argv), "date": datetime.datetime.now().isoformat(),
              "torch": torch.__version__, "config": args.config, "runs": []}
    result["gpu"], name = gpu_name(args.device), short_gpu_name(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_llama(args.config, args.device, max(args.seq_list))

    t0 = time.time()
    for seq in args.seq_list:
        for targets in [None] + target_sets:
            row = run_variant(model, targets, seq, args)
            result["runs"].append(row)
            evaluate(result["runs"])
            log({k: v for k, v in row.items() if k not in ("stats", "times_s")}, f"{time.time() - t0:.0f}s")
            (out / f"modules_{name}.json").write_text(json.dumps(result, indent=1))
            (out / f"modules_{name}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
