#!/usr/bin/env python3
"""torch.compile benchmark: the reference model (DESIGN.md; bf16, SDPA, batch 1) compiled with torch's
gradient checkpointing versus compiled with torch_offload's `hidden_states` mode (the same
checkpointing, plus the partition-time pass that offloads the checkpoint inputs through our ops),
in one process, per sequence length. Eager gradient checkpointing is reported beside them.

Per run: compile time (first step minus a steady step), median step time, tokens/s, peak
allocated / reserved memory. Per seq: boundary bytes L*S*h*2, freed = peak(ckpt compiled) -
peak(ours compiled), and the targets (throughput >= 1.0x compiled checkpointing; freed >= 95% of
the boundary bytes).

GPU:       python3 benchmarks/bench_compile.py --out DIR
CPU smoke: python benchmarks/bench_compile.py --device cpu --tiny
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from benchmarks.common import (GB, REFERENCE, add_run_args, build_llama, finish_run_args, new_result,  # noqa: E402
                               release_memory, short_gpu_name, sync, table, timed_steps)

TINY = dict(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=256)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, seqs="16384,32768", steps=4, warmup=None)  # warm-up: two steps, compile included
    p.add_argument("--variants", default="ckpt_eager,ckpt_compiled,ours_compiled")
    return finish_run_args(p.parse_args(), REFERENCE, tiny_shape=TINY, tiny_seqs="64")


def run(args, variant, seq):
    torch._dynamo.reset()
    model = build_llama(args.config, args.device, seq)
    ids = torch.randint(0, args.config["vocab"], (1, seq), device=args.device)
    if variant == "ckpt_eager":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        step_model = model
    elif variant == "ckpt_compiled":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        step_model = torch.compile(model, fullgraph=True, dynamic=False)
    else:
        step_model = torch_offload.compile(model, "hidden_states", fullgraph=True, dynamic=False)

    def step():
        loss = step_model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    row = {"variant": variant, "seq": seq}
    try:
        sync(args.device)
        t = time.perf_counter()
        step()
        sync(args.device)
        first = time.perf_counter() - t
        step()  # a second warm step: lazy backward compilation and allocator warm-up
        sync(args.device)
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        manager = getattr(getattr(step_model, "offload_partitioner", None), "manager", None)
        if manager is not None:
            manager.reset_stats()
        row.update(timed_steps(step, args.steps, seq, args.device))
        row["compile_s"] = first - row["step_s"]
        if manager is not None:
            stats = dict(manager.stats())
            row["offloaded_per_graph"] = [len(n) for n in step_model.offload_partitioner.offloaded]
            row["d2h_GB_per_step"] = stats["bytes_to_host"] / args.steps / GB
            row["compute_wait_ms_per_step"] = stats["compute_wait_ms"] / args.steps
            row["prefetch_hits"] = stats["prefetch_hits"]
    except torch.cuda.OutOfMemoryError:
        row["error"] = "OOM"
    del step_model, model
    release_memory(args.device)
    return row


def markdown(result):
    lines = [f"# torch.compile: hidden_states vs compiled gradient checkpointing on {result['gpu']}", "",
             f"command: `{result['command']}`", "",
             ]
    lines += table(result["runs"], [
        ("compile s", "compile_s", "{:.1f}"), ("step s", "step_s", "{:.3f}"), ("tok/s", "tokens_per_s", "{:.0f}"),
        ("peak alloc GB", "peak_allocated_GB", "{:.2f}"), ("peak reserved GB", "peak_reserved_GB", "{:.2f}")])
    lines += ["", "| seq | boundary GB | ours/ckpt compiled tok/s | freed GB | freed / boundary | targets met |",
              "|---|---|---|---|---|---|"]
    for s in result["summary"]:
        lines.append(f"| {s['seq']} | {s['boundary_GB']:.2f} | {s.get('speed_ratio', float('nan')):.3f} | "
                     f"{s.get('freed_GB', float('nan')):.2f} | {s.get('freed_fraction', float('nan')):.3f} | {s.get('targets_met')} |")
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    result = new_result(args, summary=[])
    name = short_gpu_name(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for seq in args.seq_list:
        rows = {}
        for variant in args.variants.split(","):
            rows[variant] = run(args, variant, seq)
            result["runs"].append(rows[variant])
            print({k: v for k, v in rows[variant].items()}, f"{time.time() - t0:.0f}s", flush=True)
        c = args.config
        summary = {"seq": seq, "boundary_GB": c["layers"] * seq * c["hidden"] * 2 / GB}
        ref, ours = rows.get("ckpt_compiled", {}), rows.get("ours_compiled", {})
        if "step_s" in ref and "step_s" in ours:
            summary["speed_ratio"] = ref["step_s"] / ours["step_s"]
        if "peak_allocated_GB" in ref and "peak_allocated_GB" in ours:
            summary["freed_GB"] = ref["peak_allocated_GB"] - ours["peak_allocated_GB"]
            summary["freed_fraction"] = summary["freed_GB"] / summary["boundary_GB"]
            summary["targets_met"] = summary.get("speed_ratio", 0) >= 1.0 and summary["freed_fraction"] >= 0.95
        result["summary"].append(summary)
        (out / f"compile_{name}.json").write_text(json.dumps(result, indent=1))
        (out / f"compile_{name}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
