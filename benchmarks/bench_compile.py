#!/usr/bin/env python3
"""torch.compile benchmark on the reference model (bf16, SDPA, batch 1), one process,
per sequence length. Variants:
  ckpt_eager       eager torch gradient checkpointing (for scale)
  ckpt_compiled    torch.compile of the model under torch's gradient checkpointing (the baseline)
  ckpt_compiled_noreuse  ckpt_compiled with inductor's buffer reuse off, as torch_offload.compile sets
                   it (how much of ours' saving that option gives compiled checkpointing too)
  sac_compiled     the same with torch's selective checkpointing keeping the attention outputs
  torch_ao         ckpt_compiled with torch 2.11's own compile-time offloading
                   (torch._functorch.config.enable_activation_offloading, every joint node marked)
  ours_compiled    torch_offload.compile(mode="hidden_states")
  ours_selective   torch_offload.compile(mode="selective"): attention outputs offloaded, not recomputed
  ours_selective_proj  the same with policy="attention+qkv+out_proj": the attention projections'
                   products offloaded too
  ours_all         torch_offload.compile(mode="all") (no checkpointing)
  VARIANT_causal   the variant with torch_offload.sdpa_is_causal(model) first: SDPA's is_causal instead
                   of the dense causal mask transformers builds while compiling
  VARIANT_detach   the variant with torch_offload.detach_logits(model) first: the logits come back
                   detached, so no zero gradient of their size is held through backward
                   (VARIANT_causal_detach: both). A variant is compared with ckpt_compiled with the
                   same options when that ran, else with ckpt_compiled_causal, else ckpt_compiled

Per run: compile time (first step minus a steady step), median step time, tokens/s, peak
allocated / reserved memory, the forward's peak, with --timeline the allocated-memory timeline
of one step (plot it with benchmarks/plot_timeline.py), and with --profile one profiled step's
summary: where the compute stream's time went (kernel time, idle time, its longest gaps), which
tells a slower step with the same kernel time from one whose kernels ran longer. Per seq: boundary
bytes L*S*h*2, ratios to ckpt_compiled, freed = peak(ckpt_compiled) - peak(variant).

Compile times are comparable between variants: before the first variant a small function is compiled
(inductor's compile workers and Triton start once, outside every variant's time), and each variant
compiles from empty caches (its own inductor and Triton cache directories, caches force-disabled), so
no variant reuses kernels another compiled. With --compile-cache DIR the runs share the caches in DIR
instead: a process that compiles what an earlier one did (a later round of benchmarks/rounds.py)
takes its kernels from there, and compile times are then not comparable (left out of the results).

With --noise-seq N, each variant's gradients at N tokens are first compared with eager checkpointing's
(relative L2 error), beside the noise floor of eager checkpointing against itself and against no
checkpointing.

Writes <out>/compile_<gpu>.json and .md (without --out, into a new temporary folder).

GPU:       python3 benchmarks/bench_compile.py --out DIR
Rounds:    python3 benchmarks/rounds.py --rounds 3 --baseline ckpt_compiled --out DIR -- python3 \\
               benchmarks/bench_compile.py --seqs 16384 --variants ckpt_compiled,ours_compiled --steps 2 \\
               --compile-cache /tmp/bench_compile_cache   (later rounds reuse round 1's compiled graphs)
Profile:   python3 benchmarks/bench_compile.py --seqs 16384 --steps 3 --variants A,B --profile A,B --out DIR
CPU smoke: python benchmarks/bench_compile.py --device cpu --tiny --out DIR
"""
import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from torch.utils.checkpoint import create_selective_checkpoint_contexts  # noqa: E402
from torch_offload import policies  # noqa: E402
from benchmarks.common import (GB, REFERENCE, add_run_args, apply_hf_options, build_llama,  # noqa: E402
                               finish_run_args, flat_grads, memory_timeline, new_result, output_dir,
                               release_memory, short_gpu_name, split_hf_options, sync, table, timed_steps,
                               trace_summary)

TINY = dict(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=256)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, seqs="16384,32768", steps=4, warmup=None)  # warm-up: two steps, compile included
    p.add_argument("--variants", default="ckpt_compiled,sac_compiled,ours_compiled,ours_selective")
    p.add_argument("--timeline", default="", help="variants whose one-step memory timeline to record")
    p.add_argument("--profile", default="",
                   help="variants of which one more step is profiled: its Chrome trace goes to the output folder "
                        "and the row gets its summary (the compute stream's kernel time, idle time, longest gaps)")
    p.add_argument("--noise-seq", type=int, default=0,
                   help="first compare each variant's gradients at this length with eager checkpointing's (0: skip)")
    p.add_argument("--min-bytes", type=int, default=None,
                   help="selective / all: smallest saved tensor ours offloads (default: the mode's own; 0 with "
                        "--tiny, whose are smaller); hidden_states offloads every checkpoint input")
    p.add_argument("--compile-cache", default="",
                   help="a directory for inductor's and Triton's caches, shared by every run and process given it "
                        "(for repeated runs, e.g. under rounds.py): compile times are then left out")
    args = finish_run_args(p.parse_args(), REFERENCE, tiny_shape=TINY, tiny_seqs="64")
    if args.min_bytes is None and args.tiny:
        args.min_bytes = 0
    return args


def _mark_all(gm, _inputs):
    for node in gm.graph.nodes:
        node.meta["should_offload"] = True
    return gm


def build(variant, model, min_bytes=None):
    """The model to step for `variant`, and the config patch its compile and steps run under."""
    variant = apply_hf_options(variant, model)
    ckpt = {"use_reentrant": False}
    if variant == "sac_compiled":
        ckpt["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policies.attention_save)
    patch = contextlib.nullcontext()
    if variant in ("ckpt_eager", "ckpt_compiled", "ckpt_compiled_noreuse", "sac_compiled", "torch_ao"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ckpt)
    if variant == "ckpt_eager":
        return model, patch
    if variant == "torch_ao":
        patch = torch._functorch.config.patch(enable_activation_offloading=True, joint_custom_pass=_mark_all)
    if variant in ("ckpt_compiled", "sac_compiled", "torch_ao"):
        return torch.compile(model, fullgraph=True, dynamic=False), patch
    if variant == "ckpt_compiled_noreuse":
        return torch.compile(model, fullgraph=True, dynamic=False, options={"allow_buffer_reuse": False}), patch
    mode = {"ours_compiled": "hidden_states", "ours_selective": "selective", "ours_selective_proj": "selective",
            "ours_all": "all"}[variant]
    extra = dict(policy="attention+qkv+out_proj") if variant == "ours_selective_proj" else {}
    if mode != "hidden_states" and min_bytes is not None:
        extra["min_bytes"] = min_bytes
    return torch_offload.compile(model, mode, fullgraph=True, dynamic=False, **extra), patch


@contextlib.contextmanager
def compile_caches(shared: str = ""):
    """Inductor's and Triton's caches for one variant. By default empty: a fresh directory for both
    (inductor's compile workers take the two variables with each task), and inductor's caches
    force-disabled. With `shared`, that directory, caches on: what an earlier run compiled is reused."""
    from torch._inductor.utils import clear_caches

    saved = {name: os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    with contextlib.ExitStack() as stack:
        directory = shared or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_compile_cache_"))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
        os.environ["TRITON_CACHE_DIR"] = os.path.join(directory, "triton")
        clear_caches()
        try:
            with torch.compiler.config.patch(force_disable_caches=not shared):
                yield
        finally:
            clear_caches()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def warm_compiler(device):
    """Compiles a small function (forward and backward) once, so that starting inductor's compile
    workers and Triton is not counted in the first variant's compile time."""
    with compile_caches():
        x = torch.randn(64, 64, device=device, requires_grad=True)
        torch.compile(lambda t: (t @ t).sin().sum(), fullgraph=True)(x).backward()
    torch._dynamo.reset()


def run(args, variant, seq):
    torch._dynamo.reset()
    model = build_llama(args.config, args.device, seq)
    ids = torch.randint(0, args.config["vocab"], (1, seq), device=args.device)
    step_model, patch = build(variant, model, args.min_bytes)
    with patch, compile_caches(args.compile_cache):
        return measure(args, variant, seq, model, step_model, ids)


def measure(args, variant, seq, model, step_model, ids):
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
        if not args.compile_cache:  # with shared caches, a compile time says what was cached before
            row["compile_s"] = first - row["step_s"]
        if manager is not None:  # read before the steps below, which are not timed
            stats = dict(manager.stats())
            if step_model.offload_partitioner.graphs:  # graphs loaded from a cache were not partitioned here
                row["offloaded_per_graph"] = [len(n) for n in step_model.offload_partitioner.offloaded]
            row["d2h_GB_per_step"] = stats["bytes_to_host"] / args.steps / GB
            row["compute_wait_ms_per_step"] = stats["compute_wait_ms"] / args.steps
            row["prefetch_hits"] = stats["prefetch_hits"]
        if variant in args.timeline.split(",") and args.device == "cuda":
            baseline = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
            step()
            row["timeline_GB"] = memory_timeline(torch.cuda.memory._snapshot(), baseline)
            torch.cuda.memory._record_memory_history(enabled=None)
        if variant in args.profile.split(",") and args.device == "cuda":
            trace = output_dir(args) / f"trace_{variant}_{seq}.json"
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as profiler:
                step()
                sync(args.device)
            profiler.export_chrome_trace(str(trace))
            row["profile"] = trace_summary(trace)
            row["profiled_busy_ms"] = row["profile"].get("compute_busy_ms")
            row["profiled_idle_ms"] = row["profile"].get("compute_idle_ms")
    except torch.cuda.OutOfMemoryError:
        row["error"] = "OOM"
    del step_model, model, ids
    release_memory(args.device)
    return row


def gradient_noise(args) -> dict:
    """One step's gradients of each variant at --noise-seq (same weights and tokens), as the relative
    L2 error against eager checkpointing, beside the noise floor: eager checkpointing against itself
    and against eager training without checkpointing."""
    ids = torch.randint(0, args.config["vocab"], (1, args.noise_seq), device=args.device,
                        generator=torch.Generator(args.device).manual_seed(1))

    def grads(variant):
        torch._dynamo.reset()
        model = build_llama(args.config, args.device, args.noise_seq)
        if variant == "eager":
            step_model, patch = model, contextlib.nullcontext()
        else:
            step_model, patch = build(variant, model, args.min_bytes)
        with patch:
            step_model(input_ids=ids, labels=ids).loss.backward()
        flat = flat_grads(model)
        del step_model, model
        release_memory(args.device)
        return flat

    reference = grads("ckpt_eager")
    norm = reference.norm().item()
    error = lambda g: (g - reference).norm().item() / norm  # noqa: E731
    result = {"seq": args.noise_seq, "floor": max(error(grads("ckpt_eager")), error(grads("eager")))}
    for variant in args.variants.split(","):
        result[variant] = error(grads(variant))
    return result


def markdown(result):
    lines = [f"# torch.compile variants on {result['gpu']}", "",
             f"command: `{result['command']}`", "",
             ]
    noise = result.get("noise")
    if noise:
        lines += [f"Gradients at seq {noise['seq']}, relative L2 error against eager checkpointing (noise floor: "
                  f"eager checkpointing against itself and against no checkpointing, {noise['floor']:.3g}): "
                  + ", ".join(f"{v} {e:.3g}" for v, e in noise.items() if v not in ("seq", "floor")), ""]
    lines += table(result["runs"], [
        ("compile s", "compile_s", "{:.1f}"), ("step s", "step_s", "{:.3f}"), ("tok/s", "tokens_per_s", "{:.0f}"),
        ("peak alloc GB", "peak_allocated_GB", "{:.2f}"), ("peak reserved GB", "peak_reserved_GB", "{:.2f}"),
        ("D2H GB/step", "d2h_GB_per_step", "{:.2f}"), ("compute wait ms/step", "compute_wait_ms_per_step", "{:.1f}"),
        ("profiled step: kernels ms", "profiled_busy_ms", "{:.1f}"), ("idle ms", "profiled_idle_ms", "{:.1f}")])
    lines += ["", "Against compiled checkpointing of the same seq, `against` (freed = its peak allocated - the variant's):",
              "", "| seq | variant | against | boundary GB | x tok/s | freed GB | freed / boundary | compile time x |",
              "|---|---|---|---|---|---|---|---|"]
    for s in result["summary"]:
        lines.append(f"| {s['seq']} | {s['variant']} | {s['against']} | {s['boundary_GB']:.2f} | "
                     f"{s.get('speed_ratio', float('nan')):.3f} | "
                     f"{s.get('freed_GB', float('nan')):.2f} | {s.get('freed_fraction', float('nan')):.3f} | "
                     f"{s.get('compile_ratio', float('nan')):.2f} |")
    return "\n".join(lines) + "\n"


def summarise(config, seq, rows) -> list:
    boundary = config["layers"] * seq * config["hidden"] * 2 / GB
    out = []
    for variant, row in rows.items():
        # Compiled checkpointing with the variant's own options when it ran, else fewer of them.
        suffix = split_hf_options(variant)[1]
        refs = ["ckpt_compiled" + suffix, "ckpt_compiled_causal" if "_causal" in suffix else None, "ckpt_compiled"]
        ref_name = next((r for r in refs if r in rows and r != variant), "ckpt_compiled")
        ref = rows.get(ref_name, {})
        if variant == ref_name or "step_s" not in row or "step_s" not in ref:
            continue
        s = {"seq": seq, "variant": variant, "against": ref_name, "boundary_GB": boundary,
             "speed_ratio": ref["step_s"] / row["step_s"]}
        if "compile_s" in row and "compile_s" in ref:
            s["compile_ratio"] = row["compile_s"] / ref["compile_s"]
        if "peak_allocated_GB" in ref and "peak_allocated_GB" in row:
            s["freed_GB"] = ref["peak_allocated_GB"] - row["peak_allocated_GB"]
            s["freed_fraction"] = s["freed_GB"] / boundary
        out.append(s)
    return out


def main():
    args = parse_args()
    result = new_result(args, summary=[])
    name = short_gpu_name(args.device)
    out = output_dir(args)
    t0 = time.time()

    def write():
        (out / f"compile_{name}.json").write_text(json.dumps(result, indent=1))
        (out / f"compile_{name}.md").write_text(markdown(result))

    warm_compiler(args.device)
    if args.noise_seq:
        result["noise"] = gradient_noise(args)
        print("noise", result["noise"], flush=True)
        write()
    for seq in args.seq_list:
        rows = {}
        for variant in args.variants.split(","):
            rows[variant] = run(args, variant, seq)
            result["runs"].append(rows[variant])
            print({k: v for k, v in rows[variant].items() if k != "timeline_GB"}, f"{time.time() - t0:.0f}s",
                  flush=True)
        result["summary"] += summarise(args.config, seq, rows)
        write()
    print(markdown(result))


if __name__ == "__main__":
    main()
