#!/usr/bin/env python3
"""torch_offload under FSDP2 (fully_shard), one process per GPU, launched with torchrun.

Model: the reference Llama (or --shape llama3_8b), random init, bf16 on CUDA (fp32 on CPU),
SDPA, batch 1 per rank, fully_shard on every decoder layer and the root (built on the meta device,
sharded, then materialised: no rank ever holds the whole model). Variants:
  ckpt       FSDP2 + torch gradient checkpointing (non-reentrant), the baseline
  hs_before  apply(model, "hidden_states") before fully_shard
  hs_after   apply(model, "hidden_states") after fully_shard
  hs_chunked apply(model, "hidden_states", chunked_loss=True) before fully_shard: the loss computed
             over chunks of tokens, never the whole sequence's logits
  all        apply(model, "all") after fully_shard (only at --all-seqs: it moves every activation)
  all_link   the same with keep_on_device_bytes="auto": the saves the rank's share of the node's link
             cannot carry during the forward stay on the GPU
  sel        apply(model, "selective") after fully_shard: policy "attention", every block offloads
             its attention outputs
  sel_link   the same with link_throttle=True: blocks past the rank's share of the node's link
             recompute their attention instead of offloading it
  sel_qkv, sel_qkv_link   the same two with policy "attention+qkv+out_proj"
  auto       apply(model, "auto") after fully_shard: the step is timed once auto has chosen (its
             trials, agreed by all ranks, run as warm-up); the choice is recorded
A step is forward and backward, no optimizer step. Publish peaks from one process per variant: in
one process, a model that something still refers to adds to every later variant's peak.
Per rank: median step time, tokens/s, peak allocated / reserved GPU memory over the measured steps,
bytes moved (manager stats). Per variant against ckpt: tokens/s ratio and peak memory freed over
the checkpoint-boundary bytes L*S*h*elem of one rank.

--longest: the longest sequence per rank that trains (one step, warm-up included) for ckpt and for
each of --longest-ours (comma-separated, in that order) on --longest-shape (default llama3_8b):
doubling from --longest-start, then bisection in --longest-step steps, up to --longest-max; every try
in a fresh model, OOM caught (all ranks agree on each outcome). Then all run timed at the longest
length all fit. --seqs "" skips the table of timed runs before the search.

Rank 0 writes <out>/fsdp2_<gpu>x<N>.json and .md (rewritten after every run; without --out, into a
new temporary folder).
GPU (2x H200): torchrun --nproc_per_node=2 benchmarks/bench_fsdp2.py --longest --out DIR
A full node:   for v in ckpt sel sel_qkv auto; do torchrun --standalone --nproc_per_node=4 \
                   benchmarks/bench_fsdp2.py --seqs 16384 --variants $v --out DIR/$v; done
CPU smoke:     torchrun --nproc_per_node=2 benchmarks/bench_fsdp2.py --device cpu --tiny --longest --out DIR
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from torch_offload.hooks.link_budget import DECISIONS, LinkBudget, PolicyLinkBudget  # noqa: E402
from torch_offload.hooks.node_link import link_bandwidth  # noqa: E402
from benchmarks.common import (GB, SHAPES, TINY, add_run_args, agree, build_llama, exit_without_finalising,  # noqa: E402
                               finish_run_args, gather, init_ranks, log, longest_fitting, new_result, output_dir,
                               past_deadline, release_memory, short_gpu_name, table, timed_steps, worst_rank)

VARIANTS = ("ckpt", "hs_before", "hs_after", "hs_chunked", "all", "all_link", "sel", "sel_link", "sel_qkv",
            "sel_qkv_link", "auto")
# Variants applied after fully_shard: (mode, options).
APPLIED_AFTER = {
    "hs_after": ("hidden_states", {}),
    "all_link": ("all", {"keep_on_device_bytes": "auto"}),
    "sel": ("selective", {}),
    "sel_link": ("selective", {"link_throttle": True}),
    "sel_qkv": ("selective", {"policy": "attention+qkv+out_proj"}),
    "sel_qkv_link": ("selective", {"policy": "attention+qkv+out_proj", "link_throttle": True}),
    "auto": ("auto", {}),
}
AUTO_MAX_WARMUP = 80  # steps auto may take to choose


def build_sharded(args, shape: dict, seq: int, variant: str):
    """A fresh model under `variant`, fully_shard per decoder layer and root; returns (model, handle)."""
    model = build_llama(shape, "meta", seq, dtype=args.dtype)
    handle = None
    if variant == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif variant == "hs_before":
        handle = torch_offload.apply(model, "hidden_states")
    elif variant == "hs_chunked":
        handle = torch_offload.apply(model, "hidden_states", chunked_loss=True)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device=args.device)
    with torch.no_grad():  # random init of each rank's shards; the rotary buffers rebuilt on device
        for name, p in model.named_parameters():
            if "norm" in name:
                p.to_local().fill_(1.0)
            else:
                p.to_local().normal_(0.0, 0.02)
        with torch.device(args.device):
            model.model.rotary_emb = type(model.model.rotary_emb)(model.config)
    if variant in APPLIED_AFTER:
        mode, options = APPLIED_AFTER[variant]
        if mode == "all" and args.tiny:
            options = dict(options, min_bytes=0)
        handle = torch_offload.apply(model, mode, **options)
    elif variant == "all":
        handle = torch_offload.apply(model, "all", min_bytes=0 if args.tiny else 1 << 20)
    return model, handle


def warmed_up(handle, steps_done: int, warmup: int, cuda: bool) -> bool:
    """Whether warm-up is over: `warmup` steps, and auto's choice and the link budget's decisions
    made (on CUDA: on CPU the link budget measures nothing)."""
    if steps_done < warmup or handle is None:
        return steps_done >= warmup
    if handle.auto is not None:
        return handle.auto.planned or steps_done >= AUTO_MAX_WARMUP
    if cuda and isinstance(handle.link_budget, PolicyLinkBudget):
        return len(handle.link_budget.history) >= DECISIONS
    return True


def choices(handle) -> dict:
    """What auto chose, how many blocks the link budget lets offload their policy's outputs, the
    window of saves kept on the GPU, and the rank's share of the link they were sized from."""
    if handle is None:
        return {}
    if handle.auto is not None:
        chosen = handle.auto.chosen
        return {"auto_chosen": None if chosen is None else repr(chosen), "auto_trials": len(handle.auto.results)}
    budget, row = handle.link_budget, {}
    if isinstance(budget, PolicyLinkBudget):
        row = {"policy_blocks": budget.policy_blocks, "blocks": budget.blocks}
    elif isinstance(budget, LinkBudget):
        row = {"window_GB": budget.window / GB}
    if budget is not None and budget.history:  # the share was measured (a cached figure: no collective)
        row["link_GB_per_s"] = link_bandwidth(torch.device("cuda", torch.cuda.current_device())) / GB
    return row


def run(args, shape: dict, seq: int, variant: str, warmup: int, steps: int) -> dict:
    """One variant at one length on this rank: timings, memory, bytes moved; or {"error": "OOM"}."""
    row = {"variant": variant, "seq": seq, "rank": dist.get_rank()}
    model = handle = None
    try:
        model, handle = build_sharded(args, shape, seq, variant)
        ids = torch.randint(0, shape["vocab"], (1, seq), device=args.device)

        def step():
            model(input_ids=ids, labels=ids).loss.backward()
            model.zero_grad(set_to_none=True)

        done = 0
        while not warmed_up(handle, done, warmup, args.device == "cuda"):
            step()
            done += 1
        row["warmup_steps"] = done
        row.update(choices(handle))
        manager = None if handle is None else handle.manager  # None where auto kept torch's checkpointing
        if manager is not None:
            manager.synchronize()
            manager.reset_stats()
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row.update(timed_steps(step, steps, seq, args.device))
        if handle is not None:
            stats = handle.stats()
            row["GB_to_host_per_step"] = stats.get("bytes_to_host", 0) / steps / GB
            row["GB_to_device_per_step"] = stats.get("bytes_to_device", 0) / steps / GB
            row["stats"] = stats
    except torch.OutOfMemoryError:
        row["error"] = "OOM"
    finally:
        if handle is not None:
            if handle.manager is not None:
                handle.manager.empty_pool()
            handle.remove()  # its hooks and wrappers, which refer to the model
        del model, handle
        release_memory(args.device)
    return row


def summarise(rows: list, shape: dict, elem_bytes: int) -> dict:
    """One line for the table from every rank's row: the worst rank's memory and time."""
    first = rows[0]
    out = {"variant": first["variant"], "seq": first["seq"], "per_rank": rows}
    errors = sorted({r["error"] for r in rows if "error" in r})
    if errors:
        out["error"] = ",".join(errors)
        return out
    out.update(worst_rank(rows))
    out["tokens_per_s_total"] = sum(r["seq"] for r in rows) / out["step_s"]
    out["boundary_GB"] = shape["layers"] * first["seq"] * shape["hidden"] * elem_bytes / GB
    return out


def compare_with_ckpt(runs: list) -> None:
    ckpt = {r["seq"]: r for r in runs if r["variant"] == "ckpt" and "error" not in r}
    for r in runs:
        base = ckpt.get(r["seq"])
        if r["variant"] == "ckpt" or "error" in r or base is None:
            continue
        r["speed_vs_ckpt"] = r["tokens_per_s_total"] / base["tokens_per_s_total"]
        if "peak_allocated_GB" in r:
            r["freed_vs_ckpt_GB"] = base["peak_allocated_GB"] - r["peak_allocated_GB"]
            r["freed_over_boundary"] = r["freed_vs_ckpt_GB"] / r["boundary_GB"]


def longest(args, shape: dict, variant: str, result: dict) -> int:
    """The longest per-rank sequence that trains one step (warm-up included) under `variant`."""
    def fits(seq):
        if past_deadline(args):
            raise TimeoutError(f"--deadline-s {args.deadline_s} reached in the longest search")
        row = run(args, shape, seq, variant, warmup=0, steps=1)
        ok = agree(args, "error" not in row)
        rows = gather(row)
        if rows is not None:
            result["longest_tries"].append({"variant": variant, "seq": seq, "fits": ok,
                                            "peaks_GB": [r.get("peak_allocated_GB") for r in rows]})
            log(f"longest {variant}: {seq} {'fits' if ok else 'does not fit'}")
        return ok

    return longest_fitting(fits, args.longest_start, args.longest_step, args.longest_max)


def markdown(result: dict) -> str:
    lines = [f"# FSDP2, {result['world_size']} ranks on {result['gpu']}", "",
             f"command: `{result['command']}`", "", "Per rank, worst rank shown; boundary = L*S*h*elem of one rank.", ""]
    lines += table(result["runs"], [
        ("step s", "step_s", "{:.3f}"), ("tok/s all ranks", "tokens_per_s_total", "{:.0f}"),
        ("vs ckpt", "speed_vs_ckpt", "{:.3f}"), ("peak alloc GB", "peak_allocated_GB", "{:.2f}"),
        ("peak reserved GB", "peak_reserved_GB", "{:.2f}"), ("freed vs ckpt GB", "freed_vs_ckpt_GB", "{:.2f}"),
        ("freed / boundary", "freed_over_boundary", "{:.3f}"), ("to host GB/step", "GB_to_host_per_step", "{:.2f}")])
    if result.get("longest"):
        lines += ["", f"## Longest sequence per rank ({result['longest_shape']})", ""]
        lines += [f"- {v}: {s}" for v, s in result["longest"].items()] + [""]
        lines += table(result.get("longest_timed", []), [
            ("step s", "step_s", "{:.3f}"), ("tok/s all ranks", "tokens_per_s_total", "{:.0f}"),
            ("vs ckpt", "speed_vs_ckpt", "{:.3f}"), ("peak alloc GB", "peak_allocated_GB", "{:.2f}")])
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, seqs="16384,32768,65536", steps=3)
    p.add_argument("--shape", default="reference", choices=sorted(SHAPES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--all-seqs", default="16384", help="lengths at which the all variant runs")
    p.add_argument("--longest", action="store_true", help="run the longest-sequence search")
    p.add_argument("--longest-shape", default="llama3_8b", choices=sorted(SHAPES))
    p.add_argument("--longest-ours", default="hs_before,hs_chunked",
                   help="variants searched after ckpt, comma-separated: " + ",".join(VARIANTS[1:]))
    p.add_argument("--longest-start", type=int, default=32768)
    p.add_argument("--longest-step", type=int, default=4096)
    p.add_argument("--longest-max", type=int, default=262144)
    p.add_argument("--timeout-s", type=int, default=900, help="collective timeout")
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="start no run after this many seconds (0: none); what was skipped is recorded")
    args = finish_run_args(p.parse_args(), SHAPES[p.parse_args().shape])
    args.longest_variants = ["ckpt"] + [v for v in args.longest_ours.split(",") if v]
    unknown = [v for v in args.longest_variants[1:] if v not in VARIANTS[1:]]
    if unknown:
        p.error(f"--longest-ours {args.longest_ours}: unknown variant(s) {unknown}; choose from {VARIANTS[1:]}")
    if args.tiny:
        args.all_seqs = ",".join(str(s) for s in args.seq_list)
        args.longest_start, args.longest_step, args.longest_max = 64, 32, 256
    args.start = time.monotonic()
    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    elem_bytes = torch.tensor([], dtype=args.dtype).element_size()

    rank, world = init_ranks(args)
    result = new_result(args, world_size=world, longest_tries=[])
    out = output_dir(args, prefix="torch_offload_fsdp2_") if rank == 0 else None
    stem = f"fsdp2_{short_gpu_name(args.device)}x{world}" + ("_tiny" if args.tiny else "")

    def save():
        if rank == 0:
            (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
            (out / f"{stem}.md").write_text(markdown(result))

    all_seqs = {int(s) for s in args.all_seqs.split(",") if s}
    for seq in args.seq_list:
        for variant in args.variants.split(","):
            if variant == "all" and seq not in all_seqs:
                continue
            if past_deadline(args):
                result["skipped"] = result.get("skipped", []) + [f"{variant}@{seq}"]
                continue
            rows = gather(run(args, args.config, seq, variant, args.warmup, args.steps))
            if rows is not None:
                result["runs"].append(summarise(rows, args.config, elem_bytes))
                compare_with_ckpt(result["runs"])
                log(f"{seq} {variant}: " + json.dumps({k: v for k, v in result["runs"][-1].items() if k != "per_rank"}))
                save()

    if args.longest:
        shape = TINY if args.tiny else SHAPES[args.longest_shape]
        result["longest_shape"] = "tiny" if args.tiny else args.longest_shape
        result["longest"], result["longest_timed"] = {}, []
        try:
            for variant in args.longest_variants:
                result["longest"][variant] = longest(args, shape, variant, result)
                save()
        except TimeoutError as error:
            result["skipped"] = result.get("skipped", []) + [str(error)]
        every = min(result["longest"].values()) if len(result["longest"]) == len(args.longest_variants) else 0
        for variant in args.longest_variants:
            if every == 0 or past_deadline(args):
                break
            rows = gather(run(args, shape, every, variant, warmup=1, steps=2))
            if rows is not None:
                result["longest_timed"].append(summarise(rows, shape, elem_bytes))
        compare_with_ckpt(result["longest_timed"])
        save()
    if rank == 0:
        log(markdown(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_finalising()
