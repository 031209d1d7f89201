#!/usr/bin/env python3
"""Benchmark of torch_offload's `hidden_states` mode against the baselines PyTorch offers.

One process, one model: a random-init LlamaForCausalLM (default: the reference 1.26B shape of
docs/performance.md, bf16, SDPA attention, batch 1) trained forward+backward (loss from labels=input_ids) at
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
short still leaves results; without --out, into a new temporary folder) and prints the markdown at
the end. benchmarks/gpu_check.sh runs this benchmark by default.

GPU (reference):  python3 benchmarks/bench_hidden_states.py --out DIR
CPU smoke test:   python benchmarks/bench_hidden_states.py --device cpu --out DIR   (tiny model, fp32)
"""
import argparse
import datetime
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

import torch

try:
    import torch_offload
except ImportError:  # running from a source checkout: benchmarks/.. holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch_offload
sys.path.append(str(Path(__file__).resolve().parents[1]))  # for benchmarks.common, after any installed package
from benchmarks.common import (GB, REFERENCE, TINY, add_out_arg, gpu_name, log, output_dir,  # noqa: E402
                               pinned_bandwidth, short_gpu_name, sync)

ALL_VARIANTS = ("none", "ckpt", "save_on_cpu", "hf_offload", "ours")
DEFAULT_VARIANTS = ("none", "ckpt", "save_on_cpu", "ours")
TINY = dict(TINY, layers=2)  # the smoke-test model of this benchmark: two layers
TARGET_SPEED = 1.00     # ours tokens/s >= this x ckpt
TARGET_FREED = 0.97     # (peak_alloc(ckpt) - peak_alloc(ours)) >= this x boundary bytes
TARGET_GAP_GB = 0.5     # (reserved - allocated) of ours <= that of ckpt + this


# --------------------------------------------------------------------------------------------------
# command line


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
    add_out_arg(p)
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


# --------------------------------------------------------------------------------------------------
# model and variants


def build_model(args, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=args.layers,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab,
        max_position_embeddings=max(args.seq_list),
        attention_dropout=0.0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(args.seed)
    with torch.device(device):  # initialise on the device: no slow CPU init of 1.26B parameters
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.config.use_cache = False
    model.train()
    return model


def train_step(model, ids, context):
    with context():
        out = model(input_ids=ids, labels=ids)
    loss = out.loss
    del out
    loss.backward()
    return loss.detach()


def free_memory(model, device):
    model.zero_grad(set_to_none=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        # pinned blocks cached by torch's host allocator (save_on_cpu, hf_offload); ours has its own
        empty_host = getattr(torch._C, "_host_emptyCache", None)
        if empty_host is not None:
            empty_host()


def torch_pinned_peak():
    """Peaks of torch's caching host (pinned) allocator since the last reset, when it reports them:
    bytes: pinned blocks it owned (rounded up to powers of two); active: bytes handed out."""
    try:
        stats = torch.cuda.host_memory_stats()
    except Exception:  # noqa: BLE001
        return None
    if "allocated_bytes.peak" not in stats:
        return None
    return {"bytes": stats["allocated_bytes.peak"], "active": stats.get("active_bytes.peak"),
            "num_host_alloc": stats.get("num_host_alloc")}


class Variant:
    """Turns one variant on (enter) and off (exit) on the shared model."""

    def __init__(self, name, model, device, manager_options):
        self.name = name
        self.model = model
        self.device = device
        self.manager_options = manager_options
        self.handle = None
        self.context = nullcontext

    def __enter__(self):
        m = self.model
        if self.name in ("ckpt", "save_on_cpu"):
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.name == "save_on_cpu":
            pin = self.device.type == "cuda"
            self.context = lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin)
        if self.name == "hf_offload":
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False},
                                            offload=True)
        if self.name == "ours":
            self.handle = torch_offload.apply(m, mode="hidden_states", **self.manager_options)
        return self

    def __exit__(self, *exc):
        m = self.model
        if self.handle is not None:
            try:
                self.handle.manager.synchronize()
            except Exception:  # noqa: BLE001  (after an OOM the manager may be mid-step)
                pass
            self.handle.remove()
        if m.is_gradient_checkpointing:
            m.gradient_checkpointing_disable()
        # gradient_checkpointing_enable registers a hook that makes the embedding output require
        # grad and leaves it in place on disable; remove it so every variant sees the same model.
        if getattr(m, "_require_grads_hook", None) is not None:
            m.disable_input_require_grads()
        return False

    def stats(self):
        return self.handle.stats() if self.handle is not None else None


# --------------------------------------------------------------------------------------------------
# runs


def offload_stats_summary(before, after, warm, n_steps, boundary):
    """Per-step figures from the manager stats of the measured steps (`after`, counted since the
    reset_stats() that followed warm-up); host_allocations is cumulative, so it is differenced."""
    def g(d, k):
        return float(d.get(k, 0.0)) if d else 0.0

    out = {
        "bytes_to_host_per_step": g(after, "bytes_to_host") / n_steps,
        "bytes_to_device_per_step": g(after, "bytes_to_device") / n_steps,
        "to_host_over_boundary": (g(after, "bytes_to_host") / n_steps) / boundary if boundary else None,
        "saves_per_step": g(after, "saves") / n_steps,
        "restores_per_step": g(after, "restores") / n_steps,
        "prefetches_per_step": g(after, "prefetches") / n_steps,
        "prefetch_hits_per_step": g(after, "prefetch_hits") / n_steps,
        "compute_wait_ms_per_step": g(after, "compute_wait_ms") / n_steps,
        "host_wait_ms_per_step": g(after, "host_wait_ms") / n_steps,
        "pool_hits": g(after, "pool_hits"),
        "pool_misses": g(after, "pool_misses"),
        "new_host_allocations_measured": g(after, "host_allocations") - g(before, "host_allocations"),
        "host_allocations_warmup": g(warm, "host_allocations"),
        "host_bytes_peak": g(after, "host_bytes_peak"),
        "host_bytes_cached": g(after, "host_bytes_cached"),
        "in_flight_peak": g(after, "in_flight_peak"),
        "live_handles_after": g(after, "live_handles"),
        "pinned": bool(g(after, "pinned")),
        "raw_measured": after,
        "raw_after_warmup": warm,
    }
    return out


def run_variant(args, model, device, name, seq, ids, manager_options):
    """Warm-up + measured steps of one variant at one sequence length. Returns a result dict."""
    cuda = device.type == "cuda"
    res = {"seq": seq, "variant": name, "status": "ok"}
    free_memory(model, device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        res["static_alloc"] = torch.cuda.memory_allocated(device)
    times, losses = [], []
    oom = None
    t_start = time.perf_counter()
    try:
        with Variant(name, model, device, manager_options) as var:
            # warm-up: at least one step; stop early when the budget would not allow the rest
            warm_times = []
            for i in range(max(1, args.warmup)):
                sync(device.type)
                t0 = time.perf_counter()
                train_step(model, ids, var.context)
                model.zero_grad(set_to_none=True)
                sync(device.type)
                warm_times.append(time.perf_counter() - t0)
                spent = time.perf_counter() - t_start
                remaining_warm = max(1, args.warmup) - i - 1
                if args.variant_budget_s and remaining_warm and (
                        spent + warm_times[-1] * (remaining_warm + min(3, args.steps))
                        > args.variant_budget_s):
                    break
            res["warmup_s"] = [round(t, 4) for t in warm_times]
            n_steps = args.steps
            if args.variant_budget_s:
                spent = time.perf_counter() - t_start
                fit = int((args.variant_budget_s - spent) / max(warm_times[-1], 1e-6))
                n_steps = max(min(3, args.steps), min(args.steps, fit))
            warm_stats = var.stats()
            stats_before = None
            if var.handle is not None:
                var.handle.manager.synchronize()
                warm_stats = var.stats()
                var.handle.manager.reset_stats()
                stats_before = var.stats()
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
                try:
                    torch.cuda.reset_peak_host_memory_stats()
                except Exception:  # noqa: BLE001
                    pass
            for _ in range(n_steps):
                sync(device.type)
                t0 = time.perf_counter()
                loss = train_step(model, ids, var.context)
                model.zero_grad(set_to_none=True)
                sync(device.type)
                times.append(time.perf_counter() - t0)
                losses.append(float(loss))
            if cuda:
                res["peak_alloc"] = torch.cuda.max_memory_allocated(device)
                res["peak_reserved"] = torch.cuda.max_memory_reserved(device)
                res["torch_pinned_peak"] = torch_pinned_peak()
            if var.handle is not None:
                var.handle.manager.synchronize()
                boundary = args.layers * args.batch * seq * args.hidden * args.elem_size
                res["offload"] = offload_stats_summary(stats_before, var.stats(), warm_stats,
                                                       n_steps, boundary)
    except torch.cuda.OutOfMemoryError as e:  # noqa: PERF203
        oom = str(e).splitlines()[0][:300]
    except Exception as e:  # noqa: BLE001  (record and go on with the other variants)
        res["status"] = "error"
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
        res["traceback"] = traceback.format_exc()[-4000:]
        log(res["traceback"])
    if oom is not None:
        res = {"seq": seq, "variant": name, "status": "OOM", "error": oom,
               "static_alloc": res.get("static_alloc")}
        if cuda:
            res["peak_alloc_before_oom"] = torch.cuda.max_memory_allocated(device)
    free_memory(model, device)
    res["wall_s"] = round(time.perf_counter() - t_start, 2)
    if times:
        med = statistics.median(times)
        res.update(
            steps=len(times),
            step_s_median=med,
            step_s_all=[round(t, 4) for t in times],
            tokens_per_s=args.batch * seq / med,
            loss_first=losses[0],
            loss_last=losses[-1],
        )
    elif res["status"] == "ok":
        res["status"] = "error"
        res.setdefault("error", "no steps measured")
    return res


def compare_grads(ref, got):
    """max |a-b|, max relative norm difference, bit-equality over two {name: grad} dicts."""
    max_abs, max_rel_norm, bit_equal, worst = 0.0, 0.0, True, None
    missing = sorted(set(ref) ^ set(got))
    for n in ref:
        if n not in got:
            continue
        a, b = ref[n].float(), got[n].float()
        diff = (a - b).abs().max().item()
        if diff > max_abs:
            max_abs, worst = diff, n
        rel = ((a - b).norm() / a.norm().clamp_min(1e-30)).item()
        max_rel_norm = max(max_rel_norm, rel)
        bit_equal = bit_equal and torch.equal(ref[n], got[n])
    return {"params_compared": len(set(ref) & set(got)), "missing_grads": missing,
            "max_abs_diff": max_abs, "max_rel_norm_diff": max_rel_norm, "worst_param": worst,
            "bit_equal": bool(bit_equal and not missing)}


def verify_gradients(args, model, device, seq, manager_options):
    """First-step gradients of ours vs ckpt on the same input (dropout 0: the recompute is the
    same computation, so they should be bit-equal). ckpt is run twice first, to show the noise
    floor of the kernels themselves (e.g. atomics in attention backward). Reported, not asserted."""
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 12345)
    ids = torch.randint(0, args.vocab, (args.batch, seq), generator=gen).to(device)
    out = {"seq": seq, "reference": "ckpt"}

    def first_step(name):
        free_memory(model, device)
        with Variant(name, model, device, manager_options) as var:
            loss = train_step(model, ids, var.context)
            sync(device.type)
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                 if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return float(loss), grads

    try:
        loss_ckpt, ref = first_step("ckpt")
        loss_again, again = first_step("ckpt")
        out["ckpt_vs_ckpt"] = compare_grads(ref, again)
        out["ckpt_vs_ckpt"]["loss_equal"] = loss_again == loss_ckpt
        del again
        loss_ours, got = first_step("ours")
        out.update(compare_grads(ref, got))
        out.update(status="ok", loss_ckpt=loss_ckpt, loss_ours=loss_ours,
                   loss_equal=loss_ckpt == loss_ours)
        del ref, got
    except torch.cuda.OutOfMemoryError as e:
        out.update(status="OOM", error=str(e).splitlines()[0][:300])
    except Exception as e:  # noqa: BLE001
        out.update(status="error", error=f"{type(e).__name__}: {e}"[:2000],
                   traceback=traceback.format_exc()[-4000:])
        log(out["traceback"])
    free_memory(model, device)
    return out


def estimate_step_s(runs, seq):
    """Rough step time at `seq` from what already ran: the slowest run at this seq, else the
    slowest at the largest smaller seq scaled by (seq ratio)^1.5 (attention grows quadratically)."""
    same = [r["step_s_median"] for r in runs if r["seq"] == seq and r.get("step_s_median")]
    if same:
        return max(same)
    prev = [r for r in runs if r["seq"] < seq and r.get("step_s_median")]
    if not prev:
        return None
    s0 = max(r["seq"] for r in prev)
    t0 = max(r["step_s_median"] for r in prev if r["seq"] == s0)
    return t0 * (seq / s0) ** 1.5


# --------------------------------------------------------------------------------------------------
# summary and report


def summarize_seq(args, seq, runs):
    by = {r["variant"]: r for r in runs if r["seq"] == seq}
    boundary = args.layers * args.batch * seq * args.hidden * args.elem_size
    s = {"seq": seq, "boundary_bytes": boundary}

    def ok(v):
        r = by.get(v)
        return r if r is not None and r.get("status") == "ok" else None

    ours, ckpt, soc = ok("ours"), ok("ckpt"), ok("save_on_cpu")
    if ours and ckpt:
        s["speed_vs_ckpt"] = ours["tokens_per_s"] / ckpt["tokens_per_s"]
        s["target_speed_met"] = s["speed_vs_ckpt"] >= TARGET_SPEED
    if ours and soc:
        s["speed_vs_save_on_cpu"] = ours["tokens_per_s"] / soc["tokens_per_s"]
    if ok("hf_offload") and ours:
        s["speed_vs_hf_offload"] = ours["tokens_per_s"] / by["hf_offload"]["tokens_per_s"]
    if ours and ckpt and "peak_alloc" in ours and "peak_alloc" in ckpt:
        freed = ckpt["peak_alloc"] - ours["peak_alloc"]
        s["freed_bytes"] = freed
        s["freed_over_boundary"] = freed / boundary
        s["target_freed_met"] = freed >= TARGET_FREED * boundary
        gap_ours = ours["peak_reserved"] - ours["peak_alloc"]
        gap_ckpt = ckpt["peak_reserved"] - ckpt["peak_alloc"]
        s["gap_ours"] = gap_ours
        s["gap_ckpt"] = gap_ckpt
        s["target_gap_met"] = gap_ours <= gap_ckpt + TARGET_GAP_GB * GB
    targets = [s[k] for k in ("target_speed_met", "target_freed_met", "target_gap_met") if k in s]
    s["all_targets_met"] = bool(targets) and all(targets) and len(targets) == (
        3 if args.device == "cuda" else 1)
    losses = {v: r["loss_first"] for v, r in by.items() if r.get("status") == "ok"}
    if losses:
        s["first_losses"] = losses
        s["losses_equal"] = len(set(losses.values())) == 1
    return s


def fmt_gb(x):
    if x is None:
        return "n/a"
    if x and abs(x) < 0.01 * GB:  # tiny smoke-test sizes
        return f"{x / 1e6:.3f} MB"
    return f"{x / GB:.2f}"


def fmt_params(n):
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def yes(b):
    return "n/a" if b is None else ("yes" if b else "**NO**")


def render_markdown(report):
    meta, runs, summary = report["meta"], report["runs"], report["summary"]
    cfg = meta["config"]
    L = []
    L.append(f"# hidden_states benchmark — {meta['gpu']}")
    L.append("")
    L.append(f"- date: {meta['date']}; torch {meta['torch']} (CUDA {meta['cuda']}), "
             f"transformers {meta['transformers']}, device {meta['device']}, dtype {meta['dtype']}")
    L.append(f"- model: random-init LlamaForCausalLM, {cfg['layers']} layers, hidden {cfg['hidden']}, "
             f"ffn {cfg['intermediate']}, {cfg['heads']} heads / {cfg['kv_heads']} kv, vocab "
             f"{cfg['vocab']}, {fmt_params(meta['params'])} params, SDPA, batch {cfg['batch']}")
    L.append(f"- steps: {meta['warmup']} warm-up (fewer under a budget) + up to {meta['steps']} measured "
             f"(median reported); per-run time budget "
             f"{str(meta['variant_budget_s']) + ' s' if meta['variant_budget_s'] else 'none'}; "
             "memory peaks over the measured steps")
    bw = meta.get("pinned_bandwidth")
    if bw:
        L.append(f"- pinned copy of {bw['bytes'] / 2**30:.0f} GiB (best of 3): D2H {bw['d2h_GBps']:.2f} GB/s, "
                 f"H2D {bw['h2d_GBps']:.2f} GB/s")
    L.append(f"- command: `{meta['command']}`")
    L.append("")
    L.append("| seq | variant | status | tok/s | step ms | peak alloc GB | peak reserved GB | "
             "reserved-alloc GB | host held GB | vs ckpt | loss |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    ckpt_tps = {r["seq"]: r.get("tokens_per_s") for r in runs
                if r["variant"] == "ckpt" and r.get("status") == "ok"}
    for r in runs:
        ok = r.get("status") == "ok"
        tps = r.get("tokens_per_s")
        alloc, resv = r.get("peak_alloc"), r.get("peak_reserved")
        gap = resv - alloc if ok and alloc is not None and resv is not None else None
        vs = tps / ckpt_tps[r["seq"]] if ok and ckpt_tps.get(r["seq"]) else None
        host = None
        if r.get("offload"):
            host = r["offload"]["host_bytes_peak"]
        elif r.get("torch_pinned_peak"):
            host = r["torch_pinned_peak"]["bytes"]
        status = r.get("status")
        if status == "skipped":
            status = "skipped (" + r.get("reason", "") + ")"
        L.append(f"| {r['seq']} | {r['variant']} | {status} | {fmt(tps, '.0f')} | "
                 f"{fmt(r.get('step_s_median') and r['step_s_median'] * 1e3, '.1f')} | "
                 f"{fmt_gb(alloc)} | {fmt_gb(resv)} | {fmt_gb(gap)} | {fmt_gb(host)} | {fmt(vs, '.3f')} | "
                 f"{fmt(r.get('loss_first'), '.4f')} |")
    L.append("")
    L.append("host held: ours = the engine's host buffer peak; save_on_cpu / hf_offload = the peak "
             "of pinned blocks owned by torch's caching host allocator (power-of-two rounded; CUDA only).")
    L.append("")
    L.append("Targets: ours >= %.2fx ckpt tokens/s; freed = peak_alloc(ckpt) - peak_alloc(ours) >= "
             "%d%% of boundary bytes L*S*h*%d; reserved-alloc gap of ours <= ckpt's + %.1f GB."
             % (TARGET_SPEED, TARGET_FREED * 100, cfg["elem_size"], TARGET_GAP_GB))
    L.append("")
    L.append("| seq | boundary GB | ours/ckpt | ours/save_on_cpu | freed GB | freed/boundary | "
             "gap ours GB | gap ckpt GB | speed ok | freed ok | gap ok | same losses |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        L.append(f"| {s['seq']} | {fmt_gb(s['boundary_bytes'])} | {fmt(s.get('speed_vs_ckpt'), '.3f')} | "
                 f"{fmt(s.get('speed_vs_save_on_cpu'), '.3f')} | {fmt_gb(s.get('freed_bytes'))} | "
                 f"{fmt(s.get('freed_over_boundary'), '.3f')} | {fmt_gb(s.get('gap_ours'))} | "
                 f"{fmt_gb(s.get('gap_ckpt'))} | {yes(s.get('target_speed_met'))} | "
                 f"{yes(s.get('target_freed_met'))} | {yes(s.get('target_gap_met'))} | "
                 f"{yes(s.get('losses_equal'))} |")
    ours_runs = [r for r in runs if r["variant"] == "ours" and r.get("offload")]
    if ours_runs:
        L.append("")
        L.append("Offload engine (ours), measured steps:")
        L.append("")
        L.append("| seq | to host GB/step | to host / boundary | to device GB/step | compute wait ms/step | "
                 "host wait ms/step | prefetch hits/restores | pool hits/misses | new pinned allocs "
                 "(measured) | pinned allocs (warm-up) | host peak GB | pinned |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in ours_runs:
            o = r["offload"]
            L.append(f"| {r['seq']} | {fmt_gb(o['bytes_to_host_per_step'])} | "
                     f"{fmt(o['to_host_over_boundary'], '.3f')} | {fmt_gb(o['bytes_to_device_per_step'])} | "
                     f"{o['compute_wait_ms_per_step']:.2f} | {o['host_wait_ms_per_step']:.2f} | "
                     f"{o['prefetch_hits_per_step']:.0f}/{o['restores_per_step']:.0f} | "
                     f"{o['pool_hits']:.0f}/{o['pool_misses']:.0f} | "
                     f"{o['new_host_allocations_measured']:.0f} | {o['host_allocations_warmup']:.0f} | "
                     f"{fmt_gb(o['host_bytes_peak'])} | {'yes' if o['pinned'] else 'no'} |")
    v = report.get("verify")
    if v:
        L.append("")
        if v.get("status") == "ok":
            L.append(f"Gradient check at seq {v['seq']} (first step, same input, ours vs ckpt): "
                     f"bit-equal: {'yes' if v['bit_equal'] else 'no'}; max abs diff "
                     f"{v['max_abs_diff']:.3e} (worst {v['worst_param']}); max relative norm diff "
                     f"{v['max_rel_norm_diff']:.3e}; {v['params_compared']} parameters; loss ckpt "
                     f"{v['loss_ckpt']:.6f}, ours {v['loss_ours']:.6f}"
                     + (f"; missing grads: {v['missing_grads']}" if v["missing_grads"] else ""))
            n = v.get("ckpt_vs_ckpt")
            if n:
                L.append("")
                L.append(f"Noise floor (ckpt run twice, same input): bit-equal: "
                         f"{'yes' if n['bit_equal'] else 'no'}; max abs diff {n['max_abs_diff']:.3e}; "
                         f"max relative norm diff {n['max_rel_norm_diff']:.3e}")
        else:
            L.append(f"Gradient check at seq {v['seq']}: {v.get('status')}: {v.get('error')}")
    L.append("")
    return "\n".join(L)


def write_report(args, report):
    out = output_dir(args)
    stem = f"hidden_states_{report['meta']['gpu_short']}"
    report["summary"] = [summarize_seq(args, s, report["runs"]) for s in
                         sorted({r["seq"] for r in report["runs"]})]
    md = render_markdown(report)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(md)
    return out / f"{stem}.json", out / f"{stem}.md", md


# --------------------------------------------------------------------------------------------------
# main


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
    gpu, gpu_short = gpu_name(device.type), short_gpu_name(device.type)
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
    output_dir(args)
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
