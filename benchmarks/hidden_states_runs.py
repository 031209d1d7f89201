"""The runs of benchmarks/bench_hidden_states.py: warm-up and measured steps of one variant at one
sequence length (run_variant, with the offload manager's per-step statistics), the first-step
gradient check of ours against ckpt (verify_gradients), and the step-time estimate that the
--deadline-s planning uses."""
import statistics
import time
import traceback

import torch

from benchmarks.hidden_states_variants import Variant, free_memory, sync, torch_pinned_peak, train_step


def log(*args):
    print(*args, flush=True)


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
                sync(device)
                t0 = time.perf_counter()
                train_step(model, ids, var.context)
                model.zero_grad(set_to_none=True)
                sync(device)
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
                sync(device)
                t0 = time.perf_counter()
                loss = train_step(model, ids, var.context)
                model.zero_grad(set_to_none=True)
                sync(device)
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
            sync(device)
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
