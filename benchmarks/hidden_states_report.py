"""The summary and report of benchmarks/bench_hidden_states.py: the targets, the per-sequence
summary checked against them (summarize_seq), the markdown tables (render_markdown) and the
<out>/hidden_states_<gpu>.json and .md files (write_report)."""
import json
from pathlib import Path

GB = 1e9
TARGET_SPEED = 1.00     # ours tokens/s >= this x ckpt
TARGET_FREED = 0.97     # (peak_alloc(ckpt) - peak_alloc(ours)) >= this x boundary bytes
TARGET_GAP_GB = 0.5     # (reserved - allocated) of ours <= that of ckpt + this


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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"hidden_states_{report['meta']['gpu_short']}"
    report["summary"] = [summarize_seq(args, s, report["runs"]) for s in
                         sorted({r["seq"] for r in report["runs"]})]
    md = render_markdown(report)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(md)
    return out / f"{stem}.json", out / f"{stem}.md", md
