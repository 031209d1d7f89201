#!/usr/bin/env python3
"""What holds GPU memory at a training step's peak: records a CUDA memory snapshot of one step per
variant and prints, for the forward and the backward, the peak and the live allocations there,
grouped by the source line that allocated them (inductor's generated code included). Used to find
why a variant frees less than it should (compiled graphs, FSDP2). For each variant it also computes the
step peak with the saved block inputs taken out of its own trace (boundary_bound): on checkpointing,
the most that offloading the boundaries could free.

Variants (comma-separated, one process, same model shape):
  ckpt_eager, ours_eager               torch checkpointing / apply(mode="hidden_states")
  ckpt_compiled, ours_compiled         torch.compile + checkpointing / torch_offload.compile(hidden_states)
  ours_selective_compiled              torch_offload.compile(model, "selective") (policy "attention");
  ours_selective_compiled_prefetchN    the same with a manager that prefetches N saves ahead
  ours_all, ours_sync                  apply(mode="all") / apply(mode="sync")
  ours_all_inflightN                   mode "all" with at most N copies in flight (max_in_flight=N)
  fsdp_ckpt, fsdp_ours_before, fsdp_ours_after
                                       FSDP2 (fully_shard per layer + root; a 1-rank NCCL group when
                                       not under torchrun): checkpointing / apply before / after
                                       fully_shard
  fsdp_ckpt_chunked, fsdp_lc_after     FSDP2 + checkpointing + apply(model, None, chunked_loss=True) /
                                       apply(model, long_context=True), both after fully_shard
  VARIANT_causal                       the variant with torch_offload.sdpa_is_causal(model) first
  VARIANT_detach, VARIANT_causal_detach  with torch_offload.detach_logits(model) first (and both)

At each peak the live allocations are also put in classes: when they were allocated (forward or
backward); FSDP2's all-gathered parameters and its reduce-scatter buffers (the gradient shards); in
forward, tensors of one block input's size (the saved boundaries); in backward, our restores.
--shape llama3_8b: the Llama-3-8B shape (every parameter trained, no optimizer step) in place of the
reference model.

Writes <out>/peak_memory.json (without --out, into a new temporary folder) and prints each variant's
peaks; snapshots (pickles, for https://pytorch.org/memory_viz) are written with --pickles.

GPU: python3 benchmarks/peak_memory.py --out DIR --layers 8 --seqs 16384 --variants ckpt_compiled,ours_compiled
     torchrun --nproc_per_node=2 benchmarks/peak_memory.py --out DIR --variants fsdp_ckpt,fsdp_ours_before
     FSDP2, 8B shape, 64K tokens per rank, one launch per variant (fresh memory), V one of
     fsdp_ckpt_chunked, fsdp_lc_after:
     torchrun --standalone --nproc_per_node=2 benchmarks/peak_memory.py --out DIR --shape llama3_8b --seqs 65536 --variants V
"""
import argparse
import json
import linecache
import os
import pickle
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from benchmarks.common import (GB, SHAPES, add_out_arg, apply_hf_options, build_llama, output_dir,  # noqa: E402
                               release_memory, replay_allocations)

# Frames skipped in naming the allocating line: torch's own package, matched by its folder (a
# virtual environment's own path may hold "/torch/"; "/site-packages/torch/" for a snapshot taken on
# another machine), and wrappers.
_TORCH_DIR = str(Path(torch.__file__).parent) + "/"
_SKIP = ("/site-packages/torch/", "/contextlib.py", "/functools.py", "benchmarks/peak_memory.py")
# FSDP2's functions whose allocations are its collectives' (torch.distributed.fsdp._fully_shard).
_FSDP_ALL_GATHER = {"foreach_all_gather", "alloc_storage"}
_FSDP_REDUCE = {"foreach_reduce"}


def _site(frames):
    """The allocating line: the innermost frame outside torch's internals (the model's own line, not
    the wrappers around it), else the first."""
    for f in frames:
        name = f.get("filename", "")
        if name and not any(s in name for s in _SKIP) and not name.startswith(("??", _TORCH_DIR)):
            return f
    for f in frames:
        if f.get("filename", "").endswith((".py",)):
            return f
    return frames[0] if frames else {"filename": "?", "line": 0, "name": "?"}


def _describe(frame):
    text = linecache.getline(frame.get("filename", ""), frame.get("line", 0)).strip()
    where = f"{Path(frame.get('filename', '?')).name}:{frame.get('line', 0)} {frame.get('name', '')}"
    return f"{where} | {text[:110]}"


def _category(index: int, backward_start: int, size: int, frames, stream, block_input_bytes: int = 0) -> str:
    """A coarse class for a live allocation, to compare two variants' peaks: when it was allocated,
    by FSDP2's collectives (unsharded parameters; gradient shards and their buffers) or not, in
    forward a block input's size or not, in backward by our restore op (prefetched on a side stream)
    or not, and its size."""
    phase = "forward" if index < backward_start else "backward"
    functions = {f.get("name") for f in frames}
    if functions & _FSDP_ALL_GATHER:
        return f"{phase}, FSDP2 all-gather (unsharded parameters)"
    if functions & _FSDP_REDUCE:
        return f"{phase}, FSDP2 reduce-scatter (gradient shards, their buffers)"
    if phase == "forward":
        return "forward, block input size" if size == block_input_bytes else "allocated in forward"
    if stream:
        return "backward, side stream (prefetched restores)"
    if any("offload_restore" in linecache.getline(f.get("filename", ""), f.get("line", 0)) for f in frames[:3]):
        return "backward, offload_restore"
    return "backward, " + (">= 100 MB" if size >= 100e6 else ">= 10 MB" if size >= 10e6 else "< 10 MB")


def analyse(snapshot, baseline: int, marks: dict, top: int = 14, block_input_bytes: int = 0) -> dict:
    """Replays the allocation trace: peak per phase (forward = events before the backward mark)
    and the live allocations at each peak, grouped by allocating line and by _category. A free of
    an allocation made before the trace (part of `baseline`) lowers the total too: the peak is
    baseline - baseline_freed + the live traced allocations."""
    trace = snapshot["device_traces"][0]
    live, total, baseline_freed = {}, 0, 0
    phase_peaks = {}
    backward_start = marks.get("backward_event", len(trace))
    for i, ev in enumerate(trace):
        action = ev["action"]
        if action == "alloc":
            live[ev["addr"]] = (ev["size"], ev.get("frames", []), ev.get("stream", 0), i)
            total += ev["size"]
        elif action == "free_completed":
            entry = live.pop(ev["addr"], None)
            size = entry[0] if entry is not None else ev.get("size", 0)
            total -= size
            baseline_freed += size if entry is None else 0
        else:
            continue
        phase = "forward" if i < backward_start else "backward"
        if total > phase_peaks.get(phase, (-1,))[0]:
            phase_peaks[phase] = (total, dict(live), i, baseline_freed)
    out = {}
    for phase, (peak, live_at_peak, index, freed) in phase_peaks.items():
        groups, categories = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
        for size, frames, stream, allocated_at in live_at_peak.values():
            key = _describe(_site(frames)) + (f" [stream {stream}]" if stream else "")
            groups[key][0] += size
            groups[key][1] += 1
            category = categories[_category(allocated_at, backward_start, size, frames, stream,
                                            block_input_bytes)]
            category[0] += size
            category[1] += 1
        ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
        out[phase] = {"peak_GB": (baseline + peak) / GB, "traced_GB": peak / GB, "baseline_freed_GB": freed / GB,
                      "event": index,
                      "events": len(trace),
                      "top": [{"GB": b / GB, "count": n, "site": k} for k, (b, n) in ranked],
                      "categories": {k: {"GB": b / GB, "count": n} for k, (b, n) in sorted(categories.items())}}
    return out


def backward_profile(snapshot, baseline: int, marks: dict, points: int = 20) -> list:
    """Allocated GB at each 1/points of the backward's events (the last value: at its end): two
    variants compared at the same progress through backward, not only at their own peaks."""
    trace = snapshot["device_traces"][0]
    start = marks.get("backward_event", len(trace))
    marks_at = {start + (len(trace) - start) * k // points for k in range(1, points + 1)}
    return [round(total / GB, 3) for i, (_, total) in enumerate(replay_allocations(trace, baseline)) if i + 1 in marks_at]


def boundary_bound(snapshot, baseline: int, marks: dict, boundary_bytes: int, layers: int) -> dict:
    """The lowest step peak that offloading the checkpoint boundaries alone could reach on this
    variant's own schedule: allocated bytes at each event less the boundaries still live then,
    maximised over the step. The boundaries are the first `layers` allocations of one block input's
    size made in forward and still live when backward starts (the saved block inputs; a later one of
    that size, such as the final norm's input, is not a boundary). Run on checkpointing: its peak
    less this bound is the most that any offload of the boundaries can free."""
    trace = snapshot["device_traces"][0]
    start = marks.get("backward_event", len(trace))
    live = {}
    for i, ev in enumerate(trace[:start]):
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], i)
        elif ev["action"] == "free_completed":
            live.pop(ev["addr"], None)
    boundaries = sorted(i for size, i in live.values() if size == boundary_bytes)[:layers]
    boundary_events = set(boundaries)
    sizes, total, live_boundaries, bound, bound_event = {}, baseline, 0, 0, 0
    for i, ev in enumerate(trace):
        if ev["action"] == "alloc":
            is_boundary = i in boundary_events
            sizes[ev["addr"]] = (ev["size"], is_boundary)
            total += ev["size"]
            live_boundaries += ev["size"] if is_boundary else 0
        elif ev["action"] == "free_completed":
            size, is_boundary = sizes.pop(ev["addr"], (ev.get("size", 0), False))  # not traced: baseline's
            total -= size
            live_boundaries -= size if is_boundary else 0
        else:
            continue
        if total - live_boundaries > bound:
            bound, bound_event = total - live_boundaries, i
    return {"boundaries": len(boundaries), "bound_peak_GB": bound / GB, "bound_event": bound_event,
            "events": len(trace)}


def mark_backward(marks) -> None:
    """Inside a step run by record_step, as its backward starts: marks where, in the trace, the
    forward ends (analyse's phases). Does nothing outside record_step (marks None)."""
    if marks is not None:
        marks["backward_event"] = len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])


def record_step(step):
    """Runs step(marks) once with CUDA's allocation history on: (what it returns, the snapshot, the
    bytes allocated before it, marks). The step calls mark_backward(marks) as its backward starts.
    The snapshot keeps the current device's trace only, as device_traces[0] (under torchrun a rank's
    own GPU), where analyse reads it."""
    torch.cuda.synchronize()
    baseline, marks = torch.cuda.memory_allocated(), {}
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        value = step(marks)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    snapshot["device_traces"] = [snapshot["device_traces"][torch.cuda.current_device()]]
    return value, snapshot, baseline, marks


def snapshot_row(step, block_input_bytes: int, top: int = 24) -> dict:
    """A benchmark's --snapshot: one more step(marks) under CUDA's allocation history; what is live at
    its forward and backward peaks (analyse: by class and by allocating line), and the step's own
    peak as torch counts it, which the trace's must equal."""
    torch.cuda.reset_peak_memory_stats()
    _, snapshot, baseline, marks = record_step(step)
    return {"baseline_GB": baseline / GB, **marks, "step_peak_GB": torch.cuda.max_memory_allocated() / GB,
            "phases": analyse(snapshot, baseline, marks, top=top, block_input_bytes=block_input_bytes)}


def _fsdp_group():
    """The NCCL group: torchrun's ranks, or one rank of our own when run as a plain script."""
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl", rank=rank, world_size=world)


def _is_rank0() -> bool:
    return int(os.environ.get("RANK", 0)) == 0


def _shard(model):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


def build_variant(variant, config, seq):
    if variant.startswith("fsdp"):
        _fsdp_group()
    model = build_llama(config, "cuda", seq)
    variant = apply_hf_options(variant, model)
    handle = None
    if variant in ("ckpt_eager", "ckpt_compiled", "fsdp_ckpt", "fsdp_ckpt_chunked"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if variant == "fsdp_ours_before":
        handle = torch_offload.apply(model, "hidden_states")
    if variant.startswith("fsdp"):
        _shard(model)
    if variant in ("ours_eager", "fsdp_ours_after"):
        handle = torch_offload.apply(model, "hidden_states")
    elif variant == "fsdp_ckpt_chunked":  # the chunked loss only; the model's checkpointing stays
        handle = torch_offload.apply(model, None, chunked_loss=True)
    elif variant == "fsdp_lc_after":
        handle = torch_offload.apply(model, long_context=True)
    elif variant in ("ours_all", "ours_sync") or variant.startswith("ours_all_inflight"):
        inflight = variant.rpartition("_inflight")[2]
        handle = torch_offload.apply(model, variant.split("_")[1],
                                     **({"max_in_flight": int(inflight)} if inflight.isdigit() else {}))
    step_model = model
    if variant == "ckpt_compiled":
        step_model = torch.compile(model, fullgraph=True, dynamic=False)
    elif variant == "ours_compiled":
        step_model = torch_offload.compile(model, "hidden_states", fullgraph=True, dynamic=False)
    elif variant.startswith("ours_selective_compiled"):  # _prefetchN: a manager prefetching N saves
        depth = variant.rpartition("_prefetch")[2]
        manager = (torch_offload.OffloadManager(prefetch_depth=int(depth), release_sources_on_save=True)
                   if depth.isdigit() else None)
        step_model = torch_offload.compile(model, "selective", fullgraph=True, dynamic=False, manager=manager)
    return model, step_model, handle


def run(args, variant, seq, out: Path):
    torch._dynamo.reset()
    model, step_model, handle = build_variant(variant, args.config, seq)
    torch.manual_seed(int(os.environ.get("RANK", 0)))  # each rank its own batch
    ids = torch.randint(0, args.config["vocab"], (1, seq), device="cuda")

    def step(marks=None):
        loss = step_model(input_ids=ids, labels=ids).loss
        torch.cuda.synchronize()
        fwd_peak = torch.cuda.max_memory_allocated()
        mark_backward(marks)
        loss.backward()
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        return fwd_peak

    t = time.perf_counter()
    step()
    step()
    warm_s = time.perf_counter() - t
    torch.cuda.reset_peak_memory_stats()
    fwd_peak, snapshot, baseline, marks = record_step(step)  # synchronizes first
    block_input_bytes = seq * args.config["hidden"] * 2  # bf16
    row = {"variant": variant, "seq": seq, "warm_s": warm_s, "baseline_GB": baseline / GB, **marks,
           "forward_peak_GB": fwd_peak / GB, "step_peak_GB": torch.cuda.max_memory_allocated() / GB,
           "boundary_GB": args.config["layers"] * block_input_bytes / GB}
    row["phases"] = analyse(snapshot, baseline, marks, args.top, block_input_bytes)
    row["backward_profile_GB"] = backward_profile(snapshot, baseline, marks)
    row["boundary_bound"] = bound = boundary_bound(snapshot, baseline, marks, block_input_bytes,
                                                   args.config["layers"])
    bound["freeable_GB"] = row["step_peak_GB"] - bound["bound_peak_GB"]
    bound["freeable_fraction"] = bound["freeable_GB"] / row["boundary_GB"]
    if handle is not None or hasattr(step_model, "offload_partitioner"):
        manager = handle.manager if handle is not None else step_model.offload_partitioner.manager
        if manager is not None:  # apply(model, None, chunked_loss=True) offloads nothing
            row["stats"] = {k: v for k, v in dict(manager.stats()).items()}
    if args.pickles and _is_rank0():
        with open(out / f"snapshot_{variant}_{seq}.pickle", "wb") as f:
            pickle.dump(snapshot, f)
    del snapshot, step_model, model, handle
    release_memory("cuda")
    return row


def print_row(row):
    print(f"\n=== {row['variant']} seq {row['seq']}: baseline {row['baseline_GB']:.2f} GB, forward peak "
          f"{row['forward_peak_GB']:.2f}, step peak {row['step_peak_GB']:.2f}, boundary {row['boundary_GB']:.2f}",
          flush=True)
    for phase, info in row["phases"].items():
        print(f"  -- {phase} peak {info['peak_GB']:.2f} GB at event {info['event']}/{info['events']} (of the "
              f"baseline, {info['baseline_freed_GB']:.3f} GB freed by then)")
        for name, c in info.get("categories", {}).items():
            print(f"     [{name}] {c['GB']:.3f} GB in {c['count']}")
        for g in info["top"]:
            print(f"     {g['GB']:7.3f} GB x{g['count']:<4d} {g['site']}")
    print("  backward, allocated GB at each 5%:", row.get("backward_profile_GB"))
    bound = row.get("boundary_bound")
    if bound:
        print(f"  with its {bound['boundaries']} boundaries taken out: peak {bound['bound_peak_GB']:.2f} GB at event "
              f"{bound['bound_event']}/{bound['events']}, so offloading them frees at most "
              f"{bound['freeable_GB']:.2f} GB ({bound['freeable_fraction']:.3f} of the boundary bytes)")
    if "stats" in row:
        s = row["stats"]
        print("  stats:", {k: s[k] for k in sorted(s) if k in (
            "saves", "restores", "bytes_to_host", "prefetch_hits", "compute_wait_ms", "host_wait_ms")})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="ckpt_compiled,ours_compiled")
    p.add_argument("--seqs", default="16384")
    p.add_argument("--shape", choices=sorted(SHAPES), default="reference")
    p.add_argument("--layers", type=int, help="the shape with this many decoder layers")
    add_out_arg(p)
    p.add_argument("--pickles", action="store_true")
    p.add_argument("--top", type=int, default=14, help="allocating lines listed at each peak")
    args = p.parse_args()
    args.config = dict(SHAPES[args.shape])
    if args.layers:
        args.config["layers"] = args.layers
    out = output_dir(args, prefix="torch_offload_peak_memory_")
    rows = []
    with torch.compiler.config.patch(force_disable_caches=True):
        for seq in [int(s) for s in args.seqs.split(",")]:
            for variant in args.variants.split(","):
                try:
                    rows.append(run(args, variant, seq, out))
                    if _is_rank0():
                        print_row(rows[-1])
                except Exception as e:  # keep going: the other variants still tell something
                    print(f"=== {variant} seq {seq}: FAILED {type(e).__name__}: {e}", flush=True)
                    release_memory("cuda")
                if _is_rank0():
                    (out / "peak_memory.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
