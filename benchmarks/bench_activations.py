#!/usr/bin/env python3
r"""Benchmark and checks of torch_offload's `all`, `sync` and `disk` modes (every saved activation
offloaded, no recompute) against no offloading and torch.autograd.graph.save_on_cpu.

One process, one random-init LlamaForCausalLM (the reference shape, bf16, SDPA, batch 1):
  0. variants: none, save_on_cpu, ours (all, sync, disk, modules; MODE:auto with the link budget,
     keep_on_device_bytes="auto", MODE:GB with that many GB kept on the GPU; hidden_states, the mode
     to set beside TRL with checkpointing), trl (TRL's OffloadActivations
     alone, no checkpointing; needs trl installed) and trl_checkpointing (what SFTConfig(
     activation_offloading=True) runs by default: the same with the model's gradient checkpointing on,
     SFTConfig's gradient_checkpointing=True, transformers' non-reentrant default); checkpointing (the
     model's gradient checkpointing alone: what TRL's hooks and ours add to it); TRL hooks the
     model's LM head for good, so without --rounds the trl variants go last;
  1. pinned host<->device bandwidth, measured here (the transfer bound uses it);
  2. per sequence length and variant: median step time, tokens/s, peak allocated / reserved GPU
     memory, bytes moved each way per step, transfer bound = bytes_d2h/bw_d2h + bytes_h2d/bw_h2d
     (forward only offloads, backward only restores, so the two phases add); target for `all`:
     step <= 1.15 x max(step without offloading, transfer bound), reserved <= allocated + 1 GB;
     per step: distinct bytes saved (storage elements the offloaded saves address), bytes copied,
     their ratio (target <= 1.05: each saved region copied once), bytes kept on the device,
     compute-stream wait;
  3. gradients in bf16 with SDPA at --noise-seq: plain training run twice gives the noise floor
     (relative L2 error of all parameter gradients); each mode's error against plain must be within it
     (all, sync, disk, and modules mode with targets *.self_attn; "modules" is also a timed variant);
  4. a soak of --soak-steps steps in `all` mode: GPU allocated/reserved and pinned host memory after
     every step, which must stay flat after the first steps.

--rounds N: every run on a fresh model (step 2 only), N interleaved rounds per length, the order of
the variants reversed every other round; the ratios of ours to the TRL variants (`all` to both,
`hidden_states` to TRL with checkpointing) and of every variant to plain training and to checkpointing
where they ran (the record's `against_none`, `against_checkpointing`) are then given per round, median
(min-max). Without it one model serves every run, in the order given.

Writes <out>/activations_<gpu>.json and .md (without --out, into a new temporary folder).

GPU:       python3 benchmarks/bench_activations.py --out DIR
           against TRL, alone and as SFTConfig(activation_offloading=True) runs it:
           python3 benchmarks/bench_activations.py --seqs 16384 --variants all,hidden_states,trl,trl_checkpointing \
               --rounds 3 --no-noise --soak-steps 0 --warmup 1 --steps 3 --out DIR
CPU smoke: python benchmarks/bench_activations.py --device cpu --tiny --soak-steps 5 --out DIR
"""
import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from benchmarks.common import (GB, REFERENCE, add_run_args, build_llama, finish_run_args, flat_grads, log,  # noqa: E402
                               new_result, output_dir, pinned_bandwidth, release_memory, short_gpu_name, sync,
                               table, timed_steps)

OURS = ("all", "sync", "disk")  # the modes that offload every saved tensor of min_bytes or more
NOISE_CHECKED = OURS + ("modules",)  # "modules": modules mode with targets *.self_attn
TRL_VARIANTS = ("trl", "trl_checkpointing")
CHECKPOINTING_VARIANTS = ("checkpointing", "trl_checkpointing")  # the model's gradient checkpointing on
# The baselines every other variant is set against, per round (against_none, against_checkpointing).
BASELINES = {"none": "plain training", "checkpointing": "checkpointing"}
# Our modes set against each TRL variant (against_trl).
OURS_AGAINST_TRL = {"trl": ("all",), "trl_checkpointing": ("all", "hidden_states")}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, seqs="4096,16384", steps=4)
    p.add_argument("--variants", default="none,save_on_cpu,all,sync,disk")
    p.add_argument("--skip", default="disk@16384", help="variant@seq pairs not to run")
    p.add_argument("--noise-seq", type=int, default=4096)
    p.add_argument("--soak-seq", type=int, default=2048)
    p.add_argument("--soak-steps", type=int, default=200)
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--no-noise", action="store_true", help="skip the bf16 gradient noise-floor check")
    p.add_argument("--disk-dir", default=None)
    p.add_argument("--rounds", type=int, default=0,
                   help="interleaved rounds: every run on a fresh model, the variants' order reversed every other "
                        "round, the ratios against TRL per round (0: one model for every run, in the given order)")
    args = finish_run_args(p.parse_args(), REFERENCE)
    if args.tiny and "--seqs" not in sys.argv:
        args.noise_seq, args.soak_seq = 64, 64
    args.variant_list = args.variants.split(",")
    args.skip_set = set(filter(None, args.skip.split(",")))
    args.disk_dir = args.disk_dir or tempfile.mkdtemp(prefix="torch_offload_bench_")
    return args


def build_model(args):
    return build_llama(args.config, args.device, max(args.seq_list + [args.noise_seq, args.soak_seq]))


def enable(model, variant, args):
    """Returns (context factory for each step, OffloadHandle or None)."""
    if variant in TRL_VARIANTS:
        # TRL's OffloadActivations as SFTConfig(activation_offloading=True) sets it up (its defaults:
        # pinned memory, a side stream, 1 KiB minimum). It hooks the lm_head for good: on a shared model
        # (no --rounds) the trl variants run last.
        from trl.models.activation_offloading import get_act_offloading_ctx_manager

        on_gpu = args.device == "cuda"
        offload = get_act_offloading_ctx_manager(model, use_pin_memory=on_gpu, use_streams=on_gpu)
        if variant == "trl_checkpointing":  # undone by run_variant
            model.gradient_checkpointing_enable()
        return (lambda: offload), None
    if variant == "none":
        return (lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)), None
    if variant == "checkpointing":  # the model's own, as trl_checkpointing runs it, without TRL's hooks
        model.gradient_checkpointing_enable()  # undone by run_variant
        return contextlib.nullcontext, None
    if variant == "save_on_cpu":
        return (lambda: torch.autograd.graph.save_on_cpu(pin_memory=args.device == "cuda")), None
    # MODE:KEEP: keep_on_device_bytes="auto" (the link budget) or KEEP GB (e.g. all:auto, all:2).
    variant, _, keep = variant.partition(":")
    kept = {} if not keep else dict(keep_on_device_bytes=keep if keep == "auto" else int(float(keep) * GB))
    if variant == "modules":
        return (lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)), torch_offload.apply(
            model, "modules", targets=["*.self_attn"], min_bytes=args.min_bytes, **kept)
    if variant in OURS:  # the modes that offload by size
        kept["min_bytes"] = args.min_bytes
    handle = torch_offload.apply(model, mode=variant, disk_dir=args.disk_dir if variant == "disk" else None,
                                 **kept)
    return (lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)), handle


def step(model, ids, ctx):
    with ctx():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss


def run_variant(model, variant, seq, args):
    try:
        ctx, handle = enable(model, variant, args)
    except ImportError as error:  # trl not installed
        return {"variant": variant, "seq": seq, "error": f"{type(error).__name__}: {error}"}
    undo_checkpointing = model.gradient_checkpointing_disable if variant in CHECKPOINTING_VARIANTS else None
    ids = torch.randint(0, args.config["vocab"], (1, seq), device=args.device)
    try:
        for _ in range(args.warmup):
            step(model, ids, ctx)
        sync(args.device)
        if handle is not None:
            handle.manager.synchronize()
            torch_offload.reset_stats(handle.manager)
            lifetime = torch_offload.stats(handle.manager)  # the disk tier's totals since apply()
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row = {"variant": variant, "seq": seq,
               **timed_steps(lambda: step(model, ids, ctx), args.steps, seq, args.device)}
        if handle is not None:
            handle.manager.synchronize()
            stats = torch_offload.stats(handle.manager)  # engine + hooks' counters
            row["stats"] = stats
            row.update(per_step_bytes(stats, args.steps))
            if stats["disk_bytes_written"]:
                row.update(per_step_disk(stats, lifetime, args.steps))
            if handle.link_budget is not None:
                row["link_budget"] = handle.link_budget.history  # (bytes saved, forward s, window) per step
            row["kept_on_device_GB"] = handle.manager.keep_on_device_bytes() / GB
        return row
    except torch.cuda.OutOfMemoryError:
        return {"variant": variant, "seq": seq, "error": "OOM"}
    finally:
        if handle is not None:
            handle.manager.empty_pool()
            handle.remove()
        if undo_checkpointing is not None:
            undo_checkpointing()
        release_memory(args.device)


def per_step_bytes(stats, steps):
    """Bytes per step from the merged stats, and copied / distinct (1.0: each region copied once)."""
    row = {"d2h_GB_per_step": stats["bytes_to_host"] / steps / GB,
           "h2d_GB_per_step": stats["bytes_to_device"] / steps / GB,
           "distinct_GB_per_step": stats["distinct_bytes_saved"] / steps / GB,
           "saved_GB_per_step": stats["saved_bytes"] / steps / GB,
           "kept_GB_per_step": stats["kept_bytes"] / steps / GB,
           "compute_wait_ms_per_step": stats["compute_wait_ms"] / steps,
           "host_wait_ms_per_step": stats["host_wait_ms"] / steps}
    if stats["distinct_bytes_saved"]:
        row["copied_over_distinct"] = stats["bytes_to_host"] / stats["distinct_bytes_saved"]
        row["copied_within_target"] = row["copied_over_distinct"] <= 1.05
    return row


def per_step_disk(stats, before, steps):
    """The disk tier's figures per measured step. Its traffic counters and checksum time are totals
    since apply() (reset_stats leaves them), so the reading taken before the steps is subtracted."""
    grew = {k: stats[k] - before[k] for k in ("disk_bytes_written", "disk_bytes_read", "disk_checksum_ms")}
    return {"disk_written_GB_per_step": grew["disk_bytes_written"] / steps / GB,
            "disk_read_GB_per_step": grew["disk_bytes_read"] / steps / GB,
            "disk_checksum_ms_per_step": grew["disk_checksum_ms"] / steps,
            "disk_read_wait_ms_per_step": stats["disk_read_wait_ms"] / steps,
            "disk_create_ms_per_step": stats["disk_create_ms"] / steps,
            "disk_close_ms_per_step": stats["disk_close_ms"] / steps}


def noise_floor(model, args):
    """Relative L2 error of each mode's gradients against plain training, beside plain vs plain."""
    ids = torch.randint(0, args.config["vocab"], (1, args.noise_seq), device=args.device)

    def grads(variant):
        ctx, handle = enable(model, variant, args)
        try:
            with ctx():
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            g = flat_grads(model)
            model.zero_grad(set_to_none=True)
            return g
        finally:
            if handle is not None:
                handle.remove()

    plain_a, plain_b = grads("none"), grads("none")
    norm = plain_a.norm().item()
    result = {"seq": args.noise_seq, "dtype": str(next(model.parameters()).dtype),
              "plain_vs_plain": (plain_b - plain_a).norm().item() / norm}
    for mode in NOISE_CHECKED:
        g = grads(mode)
        result[mode + "_vs_plain"] = max((g - plain_a).norm().item(), (g - plain_b).norm().item()) / norm
        result[mode + "_bit_equal_to_a_plain_run"] = bool(torch.equal(g, plain_a) or torch.equal(g, plain_b))
        result[mode + "_within_noise"] = result[mode + "_vs_plain"] <= max(2 * result["plain_vs_plain"], 0.0) or result[mode + "_bit_equal_to_a_plain_run"]
    return result


def soak(model, args):
    ctx, handle = enable(model, "all", args)
    ids = torch.randint(0, args.config["vocab"], (1, args.soak_seq), device=args.device)
    series = {"allocated_GB": [], "reserved_GB": [], "host_in_use_GB": [], "host_cached_GB": [],
              "host_allocations": [], "live_handles": []}
    try:
        for _ in range(args.soak_steps):
            step(model, ids, ctx)
            handle.manager.synchronize()
            stats = handle.stats()
            if args.device == "cuda":
                series["allocated_GB"].append(torch.cuda.memory_allocated() / GB)
                series["reserved_GB"].append(torch.cuda.memory_reserved() / GB)
            series["host_in_use_GB"].append(stats["host_bytes_in_use"] / GB)
            series["host_cached_GB"].append(stats["host_bytes_cached"] / GB)
            series["host_allocations"].append(int(stats["host_allocations"]))
            series["live_handles"].append(int(stats["live_handles"]))
    finally:
        handle.remove()
    after = 3  # the first steps fill the caches
    flat = {k: (max(v[after:]) - min(v[after:])) if len(v) > after else None for k, v in series.items()}
    return {"seq": args.soak_seq, "steps": args.soak_steps, "series": series,
            "spread_after_step_3": flat,
            "flat": all(x == 0 for k, x in flat.items() if x is not None)}


def markdown(result):
    bw = result.get("bandwidth", {})
    lines = [f"# all / sync / disk modes on {result['gpu']}", "", f"command: `{result['command']}`", "",
             f"pinned bandwidth: D2H {bw.get('d2h_GBps', float('nan')):.1f} GB/s, H2D {bw.get('h2d_GBps', float('nan')):.1f} GB/s", ""]
    lines += table(result["runs"], [
        ("step s", "step_s", "{:.3f}"), ("tok/s", "tokens_per_s", "{:.0f}"),
        ("peak alloc GB", "peak_allocated_GB", "{:.2f}"), ("peak reserved GB", "peak_reserved_GB", "{:.2f}"),
        ("distinct saved GB/step", "distinct_GB_per_step", "{:.2f}"), ("D2H GB/step", "d2h_GB_per_step", "{:.2f}"),
        ("H2D GB/step", "h2d_GB_per_step", "{:.2f}"), ("D2H / distinct (<= 1.05)", "copied_over_distinct", "{:.3f}"),
        ("kept GB/step", "kept_GB_per_step", "{:.2f}"), ("window GB", "kept_on_device_GB", "{:.2f}"),
        ("compute wait ms/step", "compute_wait_ms_per_step", "{:.0f}"),
        ("host wait ms/step", "host_wait_ms_per_step", "{:.0f}"),
        ("disk read wait ms/step", "disk_read_wait_ms_per_step", "{:.0f}"),
        ("checksum ms/step", "disk_checksum_ms_per_step", "{:.0f}"),
        ("file create ms/step", "disk_create_ms_per_step", "{:.0f}"),
        ("file close ms/step", "disk_close_ms_per_step", "{:.0f}"),
        ("transfer bound s", "transfer_bound_s", "{:.3f}"), ("step / max(none, bound)", "ratio_to_bound", "{:.2f}")])
    lines += against_trl(result["runs"])
    for baseline in BASELINES:
        if result.get(f"against_{baseline}"):
            lines += [""] + result[f"against_{baseline}"]
    n = result.get("noise")
    if n:
        lines += ["", f"Gradients at seq {n['seq']} ({n['dtype']}, SDPA), relative L2 error vs plain training: "
                  f"plain vs plain {n['plain_vs_plain']:.3e}; " + "; ".join(
                      f"{m} {n[m + '_vs_plain']:.3e} (within noise: {n[m + '_within_noise']})" for m in NOISE_CHECKED)]
    s = result.get("soak")
    if s:
        lines += ["", f"Soak: {s['steps']} steps of `all` at seq {s['seq']}: spread after step 3 = {s['spread_after_step_3']}; flat: {s['flat']}"]
    return "\n".join(lines) + "\n"


def against_trl(runs) -> list:
    """Ours against each TRL variant that ran at its length, per round (the runs of one round share its
    number; without --rounds, one): the step and peak ratios, median (min-max) over the rounds. Like for
    like: `all` against TRL alone (neither recomputes), `hidden_states` against TRL with checkpointing
    (both recompute and offload the checkpoint inputs); `all` is given against both. Against TRL alone
    the targets, step <= 0.9x and peak <= 0.7x TRL's, on the medians."""
    lines = []
    for variant in TRL_VARIANTS:
        name = "TRL" if variant == "trl" else "TRL with checkpointing"
        for (seq, mode), matched in matched_rounds(runs, OURS_AGAINST_TRL[variant], variant).items():
            lines.append(ratio_line(seq, mode, name, matched, targets=mode == "all" and variant == "trl"))
    return [""] + lines if lines else []


def against(runs, baseline) -> list:
    """Every other variant against `baseline` (a key of BASELINES) at its length, per round, as
    against_trl: the step and peak ratios, median (min-max) over the rounds."""
    others = sorted({r["variant"] for r in runs} - {baseline})
    return [ratio_line(seq, mode, BASELINES[baseline], matched)
            for (seq, mode), matched in matched_rounds(runs, others, baseline).items()]


def matched_rounds(runs, modes, baseline) -> dict:
    """{(seq, mode): [(ours, baseline's run), ...]}: each mode's run paired with `baseline`'s of the same
    length and round, for the runs that finished a step."""
    by = {(r["variant"], r["seq"], r.get("round")): r for r in runs if "step_s" in r}
    pairs = {}
    for (variant, seq, round_number), base in by.items():
        if variant != baseline:
            continue
        for mode in modes:
            ours = by.get((mode, seq, round_number))
            if ours is not None:
                pairs.setdefault((seq, mode), []).append((ours, base))
    return dict(sorted(pairs.items()))


def ratio_line(seq, mode, name, matched, targets=False) -> str:
    """The line "seq S: `mode` step / NAME step median (min-max); peak allocated / NAME's ..., N rounds",
    with the targets of `all` against TRL alone where `targets`."""
    step = spread([ours["step_s"] / base["step_s"] for ours, base in matched])
    line = f"seq {seq}: `{mode}` step / {name} step {step[1]}" + (
        f" (target <= 0.9: {step[0] <= 0.9})" if targets else "")
    peaks = [ours["peak_allocated_GB"] / base["peak_allocated_GB"] for ours, base in matched
             if "peak_allocated_GB" in ours and "peak_allocated_GB" in base]
    if peaks:
        peak = spread(peaks)
        line += f"; peak allocated / {name}'s {peak[1]}" + (f" (target <= 0.7: {peak[0] <= 0.7})"
                                                             if targets else "")
    return line + (f", {len(matched)} rounds" if len(matched) > 1 else "")


def spread(values) -> tuple:
    """(the median, "median (min-max)" of `values`, or the one value)."""
    median = statistics.median(values)
    if len(values) == 1:
        return median, f"{median:.3f}"
    return median, f"{median:.3f} ({min(values):.3f}-{max(values):.3f})"


def add_bounds(rows, bandwidth) -> None:
    """Each offloading row's transfer bound and, where "none" ran beside it, its step over the bound."""
    none_step = next((r["step_s"] for r in rows if r["variant"] == "none" and "step_s" in r), None)
    for row in rows:
        if "d2h_GB_per_step" not in row or bandwidth is None:
            continue
        row["transfer_bound_s"] = (row["d2h_GB_per_step"] / bandwidth["d2h_GBps"]
                                   + row["h2d_GB_per_step"] / bandwidth["h2d_GBps"])
        if none_step:
            row["ratio_to_bound"] = row["step_s"] / max(none_step, row["transfer_bound_s"])
        if "peak_reserved_GB" in row:
            row["reserved_minus_allocated_GB"] = row["peak_reserved_GB"] - row["peak_allocated_GB"]


def main():
    args = parse_args()
    result = new_result(args)
    name = short_gpu_name(args.device)
    if args.device == "cuda":
        result["bandwidth"] = pinned_bandwidth()
        log("bandwidth", result["bandwidth"])
    out = output_dir(args)
    # With --rounds every run gets a fresh model (no model of an earlier run in memory, no TRL hooks
    # left behind); without, one model serves every run.
    shared = None if args.rounds else build_model(args)

    def write():
        (out / f"activations_{name}.json").write_text(json.dumps(result, indent=1))
        (out / f"activations_{name}.md").write_text(markdown(result))

    def with_model(work):
        if shared is not None:
            return work(shared)
        model = build_model(args)
        try:
            return work(model)
        finally:
            del model
            release_memory(args.device)

    t0 = time.time()
    if not args.no_noise:
        result["noise"] = with_model(lambda model: noise_floor(model, args))
        log("noise", result["noise"], f"{time.time() - t0:.0f}s")
        write()
    for seq in args.seq_list:
        for round_index in range(max(1, args.rounds)):
            order = args.variant_list if round_index % 2 == 0 else args.variant_list[::-1]
            rows = []
            for variant in order:
                if f"{variant}@{seq}" in args.skip_set:
                    continue
                row = with_model(lambda model: run_variant(model, variant, seq, args))
                if args.rounds:
                    row["round"] = round_index + 1
                rows.append(row)
                result["runs"].append(row)
                log({k: v for k, v in row.items() if k not in ("stats", "times_s")}, f"{time.time() - t0:.0f}s")
                write()
            add_bounds(rows, result.get("bandwidth"))
            for baseline in BASELINES:
                if any(r["variant"] == baseline for r in result["runs"]):
                    result[f"against_{baseline}"] = against(result["runs"], baseline)
            write()
    if args.soak_steps:
        result["soak"] = with_model(lambda model: soak(model, args))
        log("soak", result["soak"]["spread_after_step_3"], result["soak"]["flat"], f"{time.time() - t0:.0f}s")
        write()
    print(markdown(result))


if __name__ == "__main__":
    main()
