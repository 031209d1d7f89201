#!/usr/bin/env python3
"""Benchmark of torch_offload's `hidden_states` mode against the baselines PyTorch offers.

One process, one model: a random-init LlamaForCausalLM (default: the reference 1.26B config of
DESIGN.md, bf16, SDPA attention, batch 1) trained forward+backward (loss from labels=input_ids) at
each sequence length in --seqs, under each variant:

  none         no checkpointing
  ckpt         torch gradient checkpointing, non-reentrant
               (model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}))
  save_on_cpu  ckpt, with the forward inside torch.autograd.graph.save_on_cpu(pin_memory=True)
               (moves every tensor saved outside the checkpointed layers to pinned host memory, the
               checkpoint inputs included, synchronously on the compute stream)
  hf_offload   (not run by default) transformers' gradient_checkpointing_enable(offload=True):
               save_on_cpu around each checkpointed layer only
  ours         torch_offload.apply(model, mode="hidden_states")

For each run: median step time, tokens/s, peak allocated / reserved CUDA memory over the measured
steps, and for `ours` the manager's statistics (bytes moved, compute-stream waits, pool hits and
misses, new pinned allocations during the measured steps). Per sequence length: checkpoint-boundary
bytes L*S*h*elem, throughput ratios, memory freed versus ckpt and the reserved-minus-allocated gap,
checked against the targets (throughput >= 1.00x ckpt; freed >= 97% of boundary bytes; gap of ours
<= gap of ckpt + 0.5 GB). At the smallest sequence length the first-step gradients of ours are
compared with ckpt's on the same input.

Writes <out>/hidden_states_<gpu>.json and .md (rewritten after every sequence length, so a run cut
short still leaves results) and prints the markdown at the end.

GPU (reference):  python3 benchmarks/bench_hidden_states.py
CPU smoke test:   python benchmarks/bench_hidden_states.py --device cpu   (tiny model, fp32)
"""
import argparse
import datetime
import os
import platform
import re
import shlex
import sys
import time
from pathlib import Path

import torch

try:
    import torch_offload
except ImportError:  # running from a source checkout: benchmarks/.. holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch_offload
sys.path.append(str(Path(__file__).resolve().parents[1]))  # for benchmarks.common, after any installed package
from benchmarks.common import pinned_bandwidth  # noqa: E402
# the parts of this benchmark: model and variants, runs, summary and report
from benchmarks.hidden_states_variants import build_model  # noqa: E402
from benchmarks.hidden_states_runs import estimate_step_s, log, run_variant, verify_gradients  # noqa: E402
from benchmarks.hidden_states_report import (GB, TARGET_FREED, TARGET_GAP_GB, TARGET_SPEED,  # noqa: E402
                                             fmt_params, write_report)

ALL_VARIANTS = ("none", "ckpt", "save_on_cpu", "hf_offload", "ours")
DEFAULT_VARIANTS = ("none", "ckpt", "save_on_cpu", "ours")
REFERENCE = dict(layers=24, hidden=2048, intermediate=5632, heads=16, kv_heads=8, vocab=32000)
TINY = dict(layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=512)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", default=None,
                   help="comma-separated sequence lengths (default 16384,32768,65536; "
                        "64,128 with --tiny or --device cpu)")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help="comma-separated, from " + ",".join(ALL_VARIANTS))
    p.add_argument("--skip", default="", help="variant@seq pairs not to run (known not to fit), "
                   "comma-separated, e.g. none@65536,none@131072")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="measured steps per run")
    p.add_argument("--variant-budget-s", type=float, default=0.0,
                   help="aim to spend at most this long per run, warm-up included, by running fewer "
                        "steps (at least 1 warm-up and min(3, --steps) measured); 0 = no limit")
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="skip runs that would not finish this many seconds after the start; 0 = none")
    p.add_argument("--batch", type=int, default=1)
    for name, value in REFERENCE.items():
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help=f"default {value} (tiny: {TINY[name]})")
    p.add_argument("--tiny", action="store_true",
                   help="tiny model (%s) and seqs 64,128 unless given; the default with --device cpu"
                        % ", ".join(f"{k}={v}" for k, v in TINY.items()))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"),
                   help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads with --device cpu (default 1: steadier timings of the "
                        "tiny smoke-test model on a small, busy machine)")
    p.add_argument("--no-verify", action="store_true", help="skip the gradient comparison")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the pinned bandwidth test")
    p.add_argument("--max-in-flight", type=int, default=None, help="OffloadManager option")
    p.add_argument("--prefetch-depth", type=int, default=None, help="OffloadManager option")
    p.add_argument("--host-budget-bytes", type=int, default=None, help="OffloadManager option")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--name", default=None, help="file name suffix (default: short GPU name, or cpu)")
    args = p.parse_args(argv)
    tiny = args.tiny or args.device == "cpu"
    for k, v in (TINY if tiny else REFERENCE).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.seqs is None:
        args.seqs = "64,128" if tiny else "16384,32768,65536"
    args.seq_list = sorted(int(s) for s in args.seqs.split(",") if s.strip())
    args.variant_list = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in args.variant_list:
        if v not in ALL_VARIANTS:
            p.error(f"unknown variant {v!r}")
    args.skip_set = set()
    for item in args.skip.split(","):
        item = item.strip()
        if item:
            v, _, s = item.partition("@")
            args.skip_set.add((v, int(s)))
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    return args


# ---------------------------------------------------------------------------------------------
# environment


def gpu_names(device):
    if device.type != "cuda":
        return platform.processor() or platform.machine() or "cpu", "cpu"
    full = torch.cuda.get_device_name(device)
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", full)  # H100, H200, A100, L40S, B200
    short = m.group(1).lower() if m else re.sub(r"[^a-z0-9]+", "-", full.lower()).strip("-")
    return full, short


def main(argv=None):
    args = parse_args(argv)
    t_begin = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA is not available: use --device cpu for a smoke test")
    if device.type == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    args.elem_size = torch.empty(0, dtype=dtype).element_size()
    manager_options = {k: v for k, v in (("max_in_flight", args.max_in_flight),
                                         ("prefetch_depth", args.prefetch_depth),
                                         ("host_budget_bytes", args.host_budget_bytes))
                       if v is not None}
    gpu, gpu_short = gpu_names(device)
    import transformers

    meta = {
        "gpu": gpu,
        "gpu_short": args.name or gpu_short,
        "device": args.device,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "torch_offload_library": torch_offload.library_path,
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {"layers": args.layers, "hidden": args.hidden, "intermediate": args.intermediate,
                   "heads": args.heads, "kv_heads": args.kv_heads, "vocab": args.vocab,
                   "batch": args.batch, "elem_size": args.elem_size},
        "seqs": args.seq_list,
        "variants": args.variant_list,
        "skip": sorted(f"{v}@{s}" for v, s in args.skip_set),
        "warmup": args.warmup,
        "steps": args.steps,
        "variant_budget_s": args.variant_budget_s,
        "deadline_s": args.deadline_s,
        "manager_options": manager_options,
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "targets": {"speed_vs_ckpt": TARGET_SPEED, "freed_over_boundary": TARGET_FREED,
                    "gap_margin_GB": TARGET_GAP_GB},
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta["gpu_memory_bytes"] = props.total_memory
        meta["gpu_sm_count"] = props.multi_processor_count
    log(f"[bench] {gpu} | torch {torch.__version__} | {args.dtype} | seqs {args.seq_list} | "
        f"variants {args.variant_list}")

    if not args.no_bandwidth and device.type == "cuda":
        t0 = time.perf_counter()
        meta["pinned_bandwidth"] = pinned_bandwidth()
        log(f"[bench] pinned bandwidth {meta['pinned_bandwidth']} ({time.perf_counter() - t0:.1f} s)")

    t0 = time.perf_counter()
    model = build_model(args, device, dtype)
    meta["params"] = sum(p.numel() for p in model.parameters())
    meta["model_build_s"] = round(time.perf_counter() - t0, 2)
    log(f"[bench] model: {fmt_params(meta['params'])} params, built in {meta['model_build_s']} s")

    report = {"meta": meta, "runs": [], "summary": [], "verify": None}
    if not args.no_verify and "ours" in args.variant_list:
        t0 = time.perf_counter()
        report["verify"] = verify_gradients(args, model, device, args.seq_list[0], manager_options)
        v = report["verify"]
        log(f"[bench] gradient check at seq {v['seq']} ({time.perf_counter() - t0:.1f} s): "
            + (f"bit_equal={v['bit_equal']} max_abs_diff={v['max_abs_diff']:.3e} "
               f"loss ckpt={v['loss_ckpt']:.6f} ours={v['loss_ours']:.6f} (ckpt vs ckpt: "
               f"bit_equal={v['ckpt_vs_ckpt']['bit_equal']} "
               f"max_abs_diff={v['ckpt_vs_ckpt']['max_abs_diff']:.3e})"
               if v["status"] == "ok" else f"{v['status']}: {v.get('error')}"))

    for seq in args.seq_list:
        gen = torch.Generator(device="cpu").manual_seed(args.seed + seq)
        ids = torch.randint(0, args.vocab, (args.batch, seq), generator=gen).to(device)
        for name in args.variant_list:
            if (name, seq) in args.skip_set:
                report["runs"].append({"seq": seq, "variant": name, "status": "skipped",
                                       "reason": "--skip"})
                log(f"[bench] seq {seq} {name}: skipped (--skip)")
                continue
            if args.deadline_s:
                elapsed = time.perf_counter() - t_begin
                t_est = estimate_step_s(report["runs"], seq)
                need = 5.0
                if t_est is not None:
                    n = max(1, args.warmup) + args.steps
                    if args.variant_budget_s:
                        n = min(n, max(1 + min(3, args.steps), args.variant_budget_s / t_est))
                    need += n * t_est
                if elapsed + need > args.deadline_s:
                    report["runs"].append({"seq": seq, "variant": name, "status": "skipped",
                                           "reason": f"deadline ({need:.0f} s needed, "
                                                     f"{args.deadline_s - elapsed:.0f} s left)"})
                    log(f"[bench] seq {seq} {name}: skipped (deadline)")
                    continue
            r = run_variant(args, model, device, name, seq, ids, manager_options)
            report["runs"].append(r)
            msg = f"[bench] seq {seq} {name}: {r['status']}"
            if r.get("tokens_per_s"):
                msg += (f" {r['tokens_per_s']:.0f} tok/s, step {r['step_s_median'] * 1e3:.1f} ms "
                        f"({r['steps']} steps)")
            if r.get("peak_alloc") is not None:
                msg += (f", peak alloc {r['peak_alloc'] / GB:.2f} GB, reserved "
                        f"{r['peak_reserved'] / GB:.2f} GB")
            if r.get("offload"):
                o = r["offload"]
                msg += (f", to host {o['bytes_to_host_per_step'] / GB:.3f} GB/step, compute wait "
                        f"{o['compute_wait_ms_per_step']:.2f} ms/step, pool {o['pool_hits']:.0f}/"
                        f"{o['pool_misses']:.0f}, new pinned allocs {o['new_host_allocations_measured']:.0f}")
            if r.get("error"):
                msg += f" ({r['error'][:200]})"
            log(msg + f" [{r['wall_s']} s]")
        write_report(args, report)  # after every seq, so that a run cut short leaves results

    meta["total_s"] = round(time.perf_counter() - t_begin, 1)
    json_path, md_path, md = write_report(args, report)
    log("")
    log(md)
    log(f"[bench] wrote {json_path} and {md_path} in {meta['total_s']} s")
    return report


if __name__ == "__main__":
    main()
