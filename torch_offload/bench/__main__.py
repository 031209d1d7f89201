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

from .common import build_llama, gpu_name, new_result, pinned_bandwidth, table
from .disk_bandwidth import disk_bandwidth
from .plot import plot
from .runner import DISK_VARIANTS, MODES, SHAPES, VARIANTS, add_link_utilisation, add_ratios, run

COLUMNS = [("tokens/s", "tokens_per_s", "{:.0f}"), ("x checkpointing", "x_checkpointing", "{:.3f}"),
           ("peak allocated GB", "peak_allocated_GB", "{:.2f}"), ("peak reserved GB", "peak_reserved_GB", "{:.2f}"),
           ("moved MB/step", "moved_MB", "{:.1f}"), ("compute wait ms/step", "compute_wait_ms", "{:.1f}"),
           ("host wait ms/step", "host_wait_ms", "{:.1f}"), ("D2H link use", "d2h_link_use", "{:.2f}"),
           ("H2D link use", "h2d_link_use", "{:.2f}"), ("disk read MB/step", "disk_read_MB", "{:.1f}"),
           ("read from page cache", "page_cache_share", "{:.2f}"), ("direct IO", "disk_direct_io", "{:.0f}"), ("checksum ms/step", "checksum_ms", "{:.1f}")]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torch_offload.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="reference", choices=sorted(SHAPES),
                        help="reference: DESIGN.md's 1.26B Llama; llama3-8b: its shape; tiny: for CPU")
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
