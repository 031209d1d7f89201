"""What the benchmark scripts share: model shapes, timing and memory helpers (re-exported from the
package's own bench helpers, torch_offload/bench/common.py, which `python -m torch_offload.bench`
uses too: one copy of the measuring code), plus the scripts' command-line options, output folder,
interleaved rounds, gradient comparison and the allocation-trace replay of a CUDA memory snapshot.

The scripts put the repository root on sys.path and import this module as `benchmarks.common`.
"""
import collections
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

import torch_offload
from torch_offload.bench.common import (GB, LLAMA3_8B, REFERENCE, TINY, build_llama, gpu_name,  # noqa: F401
                                        log, new_result, pinned_bandwidth, release_memory,
                                        short_gpu_name, sync, table, timed_steps)

SHAPES = {"reference": REFERENCE, "llama3_8b": LLAMA3_8B}


# ------------------------------------------------------------------------------------------------
# command line and output


def add_out_arg(parser) -> None:
    """--out: where results go. The default is a new temporary folder (printed when it is made), never
    a folder inside the repository."""
    parser.add_argument("--out", default=None,
                        help="output folder (default: a new temporary folder, printed at the start)")


def output_dir(args, prefix: str = "torch_offload_bench_") -> Path:
    """args.out as a Path, made if missing; without --out, a new temporary folder (set on args.out)."""
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix=prefix)
        log(f"writing results to {args.out}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def add_run_args(parser, seqs: str, steps: int, warmup=2) -> None:
    """The options every benchmark has: sequence lengths, warm-up (None: the script has none) and
    measured steps, device, the tiny smoke-test model, output folder."""
    parser.add_argument("--seqs", default=seqs)
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a tiny model, for CPU smoke runs")
    add_out_arg(parser)


def finish_run_args(args, shape: dict, tiny_shape: dict = TINY, tiny_seqs: str = "64,128"):
    """Sets args.config (the model shape) and args.seq_list; tiny runs default to short sequences."""
    args.config = tiny_shape if args.tiny else shape
    if args.tiny and "--seqs" not in sys.argv:
        args.seqs = tiny_seqs
    args.seq_list = [int(s) for s in args.seqs.split(",") if s]  # --seqs "": none
    return args


# ------------------------------------------------------------------------------------------------
# the longest sequence that trains (bench_fsdp2.py, bench_long_context.py)


def longest_fitting(fits, start: int, step: int, cap: int) -> int:
    """The longest length that fits: doubling from `start` while it fits (up to `cap`), then
    bisection between the last fit and the first failure on multiples of `step`; 0 if none fits."""
    fit, seq = 0, start
    while seq <= cap and fits(seq):
        fit, seq = seq, seq * 2
    if seq > cap:
        return fit  # every length tried up to the cap trained
    fail = seq
    while True:
        middle = (fit + fail) // 2 // step * step
        if middle <= fit:
            return fit
        if fits(middle):
            fit = middle
        else:
            fail = middle


# ------------------------------------------------------------------------------------------------
# torchrun scripts: every rank takes the same path


def init_ranks(args) -> tuple:
    """torchrun's process group, NCCL on CUDA (this process's GPU: LOCAL_RANK) and gloo on CPU, with
    --timeout-s as the collective timeout; returns (rank, world size)."""
    import torch.distributed as dist

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    return dist.get_rank(), dist.get_world_size()


def exit_without_finalising() -> None:
    """Ends a torchrun script after its process group is destroyed, without finalising the
    interpreter: a collective's worker thread that still has to drop a tensor then would abort the
    process (a torch bug, see python_tests/support/gloo_ranks.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def agree(args, ok: bool) -> bool:
    """True when `ok` holds on every rank: every rank takes the same path through a search."""
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], device=args.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def gather(row: dict):
    """Every rank's `row` on rank 0 (a list by rank); None on the other ranks."""
    import torch.distributed as dist

    rows = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(row, rows, dst=0)
    return rows


def past_deadline(args) -> bool:
    """Whether --deadline-s (from args.start) has passed on any rank: all ranks then skip the same runs."""
    return args.deadline_s > 0 and not agree(args, time.monotonic() - args.start < args.deadline_s)


def worst_rank(rows: list, keys=("peak_allocated_GB", "peak_reserved_GB", "step_s", "GB_to_host_per_step")) -> dict:
    """The largest value of each of `keys` over the ranks' rows (the worst rank's memory and time)."""
    worst = {}
    for key in keys:
        values = [r[key] for r in rows if key in r]
        if values:
            worst[key] = max(values)
    return worst


# ------------------------------------------------------------------------------------------------
# Hugging Face options of compiled variants

# Options a compiled variant's name can end with, in this order: VARIANT_causal_detach.
HF_OPTIONS = ("_causal", "_detach")


def split_hf_options(variant: str):
    """VARIANT_causal_detach -> ("VARIANT", "_causal_detach")."""
    suffix = ""
    for option in reversed(HF_OPTIONS):
        if variant.endswith(option):
            variant, suffix = variant[:-len(option)], option + suffix
    return variant, suffix


def apply_hf_options(variant: str, model) -> str:
    """Turns on what `variant`'s suffixes name (_causal: torch_offload.sdpa_is_causal, no dense causal
    mask; _detach: torch_offload.detach_logits) on `model`; returns the variant without them."""
    variant, suffix = split_hf_options(variant)
    if "_causal" in suffix:
        torch_offload.sdpa_is_causal(model)
    if "_detach" in suffix:
        torch_offload.detach_logits(model)
    return variant


# ------------------------------------------------------------------------------------------------
# gradients and rounds


def flat_grads(model) -> torch.Tensor:
    """Every parameter gradient of `model`, in fp32, as one vector (for relative errors)."""
    return torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])


def median_rounds(runs: list) -> list:
    """One row per (variant, seq) of `runs` (every round of --rounds, which interleaves the variants
    so that drift of the machine falls on all of them alike): the round with the median step time,
    with `rounds` and every round's `step_s_rounds`; a failed run stands where no round succeeded."""
    groups = {}
    for r in runs:
        if "error" not in r:
            groups.setdefault((r["variant"], r["seq"]), []).append(r)
    rows = []
    for rounds in groups.values():
        rounds = sorted(rounds, key=lambda r: r["step_s"])
        row = dict(rounds[len(rounds) // 2])
        row["rounds"] = len(rounds)
        row["step_s_rounds"] = [r["step_s"] for r in rounds]
        rows.append(row)
    for r in runs:
        if "error" in r and (r["variant"], r["seq"]) not in groups:
            rows.append(r)
    return rows


# ------------------------------------------------------------------------------------------------
# CUDA memory snapshots (torch.cuda.memory._snapshot())


def replay_allocations(trace, baseline: int):
    """Replays a device trace: (whether the event allocated or freed, allocated bytes after it) for
    each event. A free of an allocation made before the trace comes off `baseline`."""
    sizes, total = {}, baseline
    for ev in trace:
        changed = True
        if ev["action"] == "alloc":
            sizes[ev["addr"]] = ev["size"]
            total += ev["size"]
        elif ev["action"] == "free_completed":
            total -= sizes.pop(ev["addr"], ev.get("size", 0))
        else:
            changed = False
        yield changed, total


def memory_timeline(snapshot, baseline: int, points: int = 1500) -> list:
    """Allocated GB after each traced alloc/free of device 0, thinned to about `points` values (each
    kept value is the largest of its stretch, so the peak survives)."""
    series = [total / GB for changed, total in replay_allocations(snapshot["device_traces"][0], baseline)
              if changed]
    stride = max(1, len(series) // points)
    return [round(max(series[i:i + stride]), 4) for i in range(0, len(series), stride)]


# ------------------------------------------------------------------------------------------------
# profiler traces (torch.profiler's exported Chrome trace of one step)


def trace_summary(path, gaps: int = 5) -> dict:
    """What one profiled step's Chrome trace says of the GPU's time: kernel time per CUDA stream, the
    kernels' span, copy time per (stream, kind), the CUDA runtime calls that took longest; and, on
    the stream with the most kernel time (the compute stream), the time within its span that it ran
    no kernel and its `gaps` longest idle gaps, each with the kernels on either side and its start in
    ms from the stream's first kernel. Same kernel time with more idle time means the stream waited
    (on an event, a copy, the host's launches), not that its kernels ran slower."""
    busy, copies = collections.Counter(), collections.Counter()
    runtime = collections.defaultdict(lambda: [0, 0.0])
    kernels = collections.defaultdict(list)
    for e in json.loads(Path(path).read_text())["traceEvents"]:
        category, duration = e.get("cat", ""), e.get("dur", 0)
        if category == "kernel":
            stream = e["args"].get("stream")
            busy[stream] += duration
            kernels[stream].append(e)
        elif category == "gpu_memcpy":
            copies[(e["args"].get("stream"), e["name"][:40])] += duration
        elif category == "cuda_runtime":
            runtime[e["name"]][0] += 1
            runtime[e["name"]][1] += duration
    every = [e for stream in kernels.values() for e in stream]
    span = (max(e["ts"] + e["dur"] for e in every) - min(e["ts"] for e in every)) if every else 0.0
    top = sorted(runtime.items(), key=lambda kv: -kv[1][1])[:8]
    summary = {"kernel_busy_ms_per_stream": {str(k): v / 1e3 for k, v in busy.items()},
               "kernel_span_ms": span / 1e3,
               "copies_ms": {f"{k[0]}:{k[1]}": v / 1e3 for k, v in copies.items()},
               "runtime_top": {k: {"count": c, "ms": d / 1e3} for k, (c, d) in top}}
    if not every:
        return summary
    compute = max(busy, key=busy.get)
    ordered = sorted(kernels[compute], key=lambda e: e["ts"])
    first, end, found = ordered[0]["ts"], ordered[0]["ts"] + ordered[0]["dur"], []
    for before, after in zip(ordered, ordered[1:]):
        if after["ts"] > end:
            found.append((after["ts"] - end, before["name"][:60], after["name"][:60], end - first))
        end = max(end, after["ts"] + after["dur"])
    found.sort(key=lambda g: -g[0])
    summary.update(compute_stream=str(compute), compute_kernels=len(ordered), compute_busy_ms=busy[compute] / 1e3,
                   compute_idle_ms=(end - first - busy[compute]) / 1e3,
                   largest_gaps=[{"ms": g / 1e3, "after": a, "before": b, "at_ms": at / 1e3}
                                 for g, a, b, at in found[:gaps]])
    return summary
