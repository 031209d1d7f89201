"""python -m torch_offload.bench [--model reference|llama3-8b|tiny] [--modes ...] [--seqs ...]

Trains a random-init LlamaForCausalLM (bf16 on CUDA, fp32 on CPU; SDPA; batch 1) forward+backward
under each variant at each sequence length, prints a table and optionally writes JSON and, per run
of our modes, a torch.profiler trace. Variants: none, checkpointing (torch's, non-reentrant), and
our modes hidden_states, hidden_states_disk (hidden_states through the disk tier), all, sync, disk.
Examples:

    python -m torch_offload.bench --modes checkpointing,hidden_states --seqs 16384,32768 --json r.json
    python -m torch_offload.bench --model tiny --device cpu --seqs 64 --steps 1   # smoke test
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from ..apply import apply
from .common import (LLAMA3_8B, REFERENCE, TINY, add_link_utilisation, add_ratios, build_llama, gpu_name, new_result,
                     pinned_bandwidth, release_memory, table, timed_steps)
from .disk_bandwidth import disk_bandwidth
from .plot import plot

SHAPES = {"reference": REFERENCE, "llama3-8b": LLAMA3_8B, "tiny": TINY}
BASELINES = ("none", "checkpointing")
# hidden_states_disk: hidden_states through the disk tier (disk_only=True), for hosts short of RAM;
# hidden_states_disk_direct: the same with disk_direct_io=True (files bypass the page cache).
MODES = ("hidden_states", "hidden_states_disk", "hidden_states_disk_direct", "all", "sync", "disk")
VARIANTS = BASELINES + MODES
_TAKES_MIN_BYTES = ("all", "sync", "disk")
DISK_VARIANTS = ("disk", "hidden_states_disk", "hidden_states_disk_direct")
COLUMNS = [("tokens/s", "tokens_per_s", "{:.0f}"), ("x checkpointing", "x_checkpointing", "{:.3f}"),
           ("peak allocated GB", "peak_allocated_GB", "{:.2f}"), ("peak reserved GB", "peak_reserved_GB", "{:.2f}"),
           ("moved MB/step", "moved_MB", "{:.1f}"), ("compute wait ms/step", "compute_wait_ms", "{:.1f}"),
           ("host wait ms/step", "host_wait_ms", "{:.1f}"), ("D2H link use", "d2h_link_use", "{:.2f}"),
           ("H2D link use", "h2d_link_use", "{:.2f}"), ("disk read MB/step", "disk_read_MB", "{:.1f}"),
           ("read from page cache", "page_cache_share", "{:.2f}"), ("direct IO", "disk_direct_io", "{:.0f}"), ("checksum ms/step", "checksum_ms", "{:.1f}")]


def run(model, variant: str, seq: int, device: str, warmup: int, steps: int, options: dict,
        trace_path=None) -> dict:
    """Measures `variant` on `model` at batch 1 x `seq` tokens and leaves the model as it was.
    `options`: apply() options (min_bytes only goes to the modes that take it). Returns the row:
    step_s, tokens_per_s, peaks (CUDA), and for our modes the bytes moved and the waits per step;
    {"error": ...} when the run runs out of memory."""
    row = {"seq": seq, "variant": variant}
    ids = torch.randint(0, model.config.vocab_size, (1, seq), device=device)
    handle = None
    try:
        if variant == "checkpointing":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif variant != "none":
            mode_options = {k: v for k, v in options.items()
                            if v is not None and (k != "min_bytes" or variant in _TAKES_MIN_BYTES)
                            and (k != "disk_direct_io" or variant in DISK_VARIANTS)}
            if variant.startswith("hidden_states_disk"):
                mode_options.update(disk_dir=mode_options.get("disk_dir") or tempfile.gettempdir(), disk_only=True)
            if variant == "hidden_states_disk_direct":
                mode_options.update(disk_direct_io=True)
            handle = apply(model, variant.split("_disk")[0], **mode_options)

        def step():
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()

        for _ in range(warmup):
            step()
        before = handle.stats() if handle is not None else {}
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row.update(timed_steps(step, steps, seq, device))
        if handle is not None:
            after = handle.stats()
            per_step = {k: (after[k] - before.get(k, 0)) / steps for k in after}
            row["moved_MB"] = (per_step["bytes_to_host"] + per_step["bytes_to_device"]) / 2**20
            row["to_host_MB"] = per_step["bytes_to_host"] / 2**20
            row["to_device_MB"] = per_step["bytes_to_device"] / 2**20
            row["compute_wait_ms"] = per_step.get("compute_wait_ms")
            row["host_wait_ms"] = per_step.get("host_wait_ms")
            if per_step.get("disk_bytes_written"):
                row["disk_written_MB"] = per_step["disk_bytes_written"] / 2**20
                row["disk_read_MB"] = per_step["disk_bytes_read"] / 2**20
                row["checksum_ms"] = per_step["disk_checksum_ms"]
                row["disk_direct_io"] = after.get("disk_direct_io", 0)
                if after.get("disk_bytes_read_from_page_cache", -1) >= 0 and per_step["disk_bytes_read"]:
                    row["page_cache_share"] = per_step["disk_bytes_read_from_page_cache"] / per_step["disk_bytes_read"]
        if trace_path is not None:
            _trace(step, device, trace_path)
            row["trace"] = str(trace_path)
    except torch.OutOfMemoryError:
        row["error"] = "out of memory"
    finally:
        if handle is not None:
            handle.remove()
        if variant == "checkpointing":
            model.gradient_checkpointing_disable()
        model.zero_grad(set_to_none=True)
        del ids
        release_memory(device)
    return row


def _trace(step, device: str, path) -> None:
    """One more step under torch.profiler, written as a Chrome trace (chrome://tracing, Perfetto):
    on CUDA its timeline shows our copies (side stream) next to the compute kernels."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    profiler.export_chrome_trace(str(path))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torch_offload.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="reference", choices=sorted(SHAPES),
                        help="reference: the 1.26B reference Llama (docs/performance.md); llama3-8b: its shape; tiny: for CPU")
    parser.add_argument("--modes", default="none,checkpointing,hidden_states",
                        help="comma-separated, from " + ",".join(VARIANTS))
    parser.add_argument("--seqs", default="4096,16384", help="comma-separated sequence lengths")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    parser.add_argument("--min-bytes", type=int, default=None, help="min_bytes of all/sync/disk (default apply()'s)")
    parser.add_argument("--prefetch-depth", type=int, default=None, help="prefetch_depth of our modes (default apply()'s)")
    parser.add_argument("--max-in-flight", type=int, default=None, help="max_in_flight of our modes (default apply()'s)")
    parser.add_argument("--disk-dir", default=None, help="disk_dir of the disk and hidden_states_disk modes (default: the temp dir)")
    parser.add_argument("--disk-direct-io", action="store_true",
                        help="disk_direct_io=True for the disk and hidden_states_disk modes (files bypass the page "
                             "cache; hidden_states_disk_direct is hidden_states_disk with it)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--png", default=None, help="write a plot of peak memory and tokens/s here (matplotlib)")
    parser.add_argument("--trace", default=None, help="folder for one profiler trace per run of our modes")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    args.variants = [v.strip() for v in args.modes.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)}; expected some of {', '.join(VARIANTS)}")
    args.seq_list = [int(s) for s in args.seqs.split(",")]
    args.config = SHAPES[args.model]
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available on this machine (use --device cpu)")
    return args


def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if not enabled or tqdm is None:
        return None
    return tqdm(total=total, unit="run", file=sys.stderr)


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = new_result(args, model=args.model, device=args.device)
    if args.device == "cuda" and any(v in MODES for v in args.variants):
        # Link use = bytes copied / (step time x this bandwidth), per direction.
        result["link_bandwidth"] = pinned_bandwidth()
    model = build_llama(args.config, args.device, max(args.seq_list))
    options = {"min_bytes": args.min_bytes, "disk_dir": args.disk_dir, "prefetch_depth": args.prefetch_depth,
               "max_in_flight": args.max_in_flight, "disk_direct_io": args.disk_direct_io or None}
    if any(v in DISK_VARIANTS for v in args.variants):
        result["disk_bandwidth"] = disk_bandwidth(args.disk_dir or tempfile.gettempdir())
    trace_dir = Path(args.trace) if args.trace else None
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
    bar = _progress(len(args.seq_list) * len(args.variants), not args.no_progress)
    for seq in args.seq_list:
        for variant in args.variants:
            if bar is not None:
                bar.set_description(f"{variant} @ {seq}")
            trace = trace_dir / f"{variant}_{seq}.json" if trace_dir is not None and variant in MODES else None
            result["runs"].append(run(model, variant, seq, args.device, args.warmup, args.steps, options, trace))
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    add_ratios(result["runs"])
    if "link_bandwidth" in result:
        for row in result["runs"]:
            add_link_utilisation(row, result["link_bandwidth"])
    print(f"{args.model} Llama on {gpu_name(args.device)}, batch 1, median of {args.steps} steps")
    print("\n".join(table(result["runs"], COLUMNS)))
    if "disk_bandwidth" in result:
        print("disk_dir's own bandwidth (GB/s):", ", ".join(
            f"{k.removesuffix('_GBps')} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
            for k, v in result["disk_bandwidth"].items() if k != "bytes"))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    if args.png:
        plot(result, args.png)
        print(f"wrote {args.png}")
    return result


if __name__ == "__main__":
    main()
