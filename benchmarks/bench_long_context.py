#!/usr/bin/env python3
"""How long a sequence one GPU trains, and how fast: the Llama-3-8B shape with PEFT LoRA adapters.

Model: LlamaForCausalLM of the shape (--shape llama3_8b: 32 layers, hidden 4096, ffn 14336; --layers
N for a slice), random init, bf16 (fp32 on CPU), SDPA, built on the device; PEFT LoRA rank 16,
alpha 32, dropout 0 on q/k/v/o/gate/up/down, the base frozen, the adapters in fp32 (PEFT's default;
--lora-dtype bf16 keeps them in the model's dtype). Batch 1, random ids, labels = ids; every step is
forward, backward and an AdamW step on the LoRA parameters. A fresh model for every run and every
try of the search, with the device memory checked back to ~0 first. Variants (--variants):

  ckpt          model.gradient_checkpointing_enable(use_reentrant=False), the model's own loss: what a
                user does today
  ckpt_liger    the same with Liger Kernel's fused linear cross entropy (apply_liger_kernel_to_llama
                on the model instance with only fused_linear_cross_entropy on): the strongest baseline
                a long-context user runs; only the loss differs from ckpt
  ckpt_chunked  the same with torch_offload's chunked loss alone (chunk_lm_loss, no offloading): the
                loss ours uses (its gradients computed in the forward)
  hf_offload    ckpt with transformers' offload=True (save_on_cpu around each checkpoint)
  hf_offload_liger  hf_offload with Liger's fused linear cross entropy
  ours          torch_offload.apply(model, "hidden_states", long_context=True): layer inputs in host
                memory (disk past the host budget), chunked loss, tiled MLP, frozen base offloaded;
                from the second step at a length, the layers whose weights fit in the memory the
                first step left keep them on the GPU (time it with --warmup 2)
  ours_every_layer_offloaded  ours with layer_offloading={"keep_layers_that_fit": False}: every
                layer's weights copied at every visit
  ours_weights_on_gpu  the same with layer_offloading=False: the frozen base stays on the GPU
  ours_untiled  torch_offload.apply(model, "hidden_states", chunked_loss=True): no tiled MLP
  ours_loss_grads_in_backward  ours with chunked_loss={"grads_in_forward": False}: the loss's
                gradients in backward, the LM head's product computed a second time there

--longest: per variant (--longest-variants), the longest S that trains one step: doubling from
--longest-start, then bisection on multiples of --longest-step, up to --longest-max; an
out-of-memory error means it does not fit. A try whose step took longer than --try-timeout-s stops
that variant's search, and --deadline-s (seconds since the start) stops everything: the length is
then reported as "at least". Every try is recorded (length, fits, step seconds, peak).
--seqs: timed steps (--warmup, then the median of --steps) at each length: step time, tokens/s, peak
allocated / reserved GPU memory; for ours the engine's statistics over the measured steps (host
peak, bytes to host, disk bytes written, spills; the frozen weights' copies) and handle.explain().
An out-of-memory length is recorded as OOM. --snapshot (CUDA): one more step after the measured ones
under CUDA's allocation history; the row's snapshot holds what is live at that step's forward and
backward peaks (benchmarks/peak_memory.py's analyse; the backward's includes AdamW's step), by class
and by allocating line. --timed-longest: each variant timed at its own longest
length; --timed-longest VARIANT: every variant timed at VARIANT's longest.
--rounds N (or one number per --seqs length, e.g. 3,2): every variant N times per length, each run on
a fresh model, in interleaved rounds; odd rounds run the variants in reverse order, so that drift of
the machine and the position in a round fall on all of them alike. Every run is recorded; the
summary gives per (variant, length) the step time min / median / max, the peaks, and the ratio of
its tokens/s to --baseline's (default ckpt_liger) in the same round, min / median / max over rounds.

The *_liger variants need Liger Kernel (pip install torch_offload[bench], or liger-kernel==0.8.5),
whose Triton kernels need CUDA: on CPU they are refused.

Writes <out>/long_context.json, .md and .png (peak GPU memory and tokens/s against the length; on
CPU memory is not measured; a run cut short: python -m torch_offload.bench.plot long_context.json
long_context.png); without --out, into a new temporary folder.

GPU:       python3 benchmarks/bench_long_context.py --longest --variants ckpt,hf_offload --seqs "" \\
               --deadline-s 420 --out DIR
           ours against the strongest baseline at 64K, one H200, about 490 s: 6 runs, each a fresh model
           (20-30 s) and 3 steps of ~18 s (two warm-up: ours keeps the layers that fit from its second
           step); no run starts after 440 s. Without
           network, Liger from a downloaded wheel (pip download liger-kernel==0.8.5 --no-deps -d WHEELS):
           pip install --no-deps --no-index WHEELS/liger_kernel-0.8.5-py3-none-any.whl && \\
           python3 benchmarks/bench_long_context.py --variants ckpt_liger,ours --seqs 65536 \\
               --rounds 3 --warmup 2 --steps 1 --deadline-s 440 --out DIR
           python3 benchmarks/bench_long_context.py --variants ours --seqs 262144 --warmup 0 --steps 1 --out DIR
What holds each peak at 32K, ours with every layer offloaded beside its baseline (one H200, ~3 minutes):
           python3 benchmarks/bench_long_context.py --variants ckpt_liger,ours_every_layer_offloaded \\
               --seqs 32768 --warmup 1 --steps 1 --snapshot --out DIR
CPU smoke: python benchmarks/bench_long_context.py --device cpu --tiny --longest --out DIR
"""
import argparse
import inspect
import json
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from torch_offload._library.node_budget import host_memory_bytes  # noqa: E402
from benchmarks.common import (GB, LLAMA3_8B, add_run_args, build_llama, finish_run_args, log,  # noqa: E402
                               longest_fitting, new_result, output_dir, release_memory, table, timed_steps)
from benchmarks.peak_memory import mark_backward, snapshot_row  # noqa: E402

VARIANTS = ("ckpt", "ckpt_liger", "ckpt_chunked", "hf_offload", "hf_offload_liger", "ours",
            "ours_every_layer_offloaded", "ours_weights_on_gpu", "ours_untiled", "ours_loss_grads_in_backward")
CHECKPOINTED = ("ckpt", "ckpt_liger", "ckpt_chunked", "hf_offload", "hf_offload_liger")  # transformers' checkpointing
LIGER_VARIANTS = ("ckpt_liger", "hf_offload_liger")
FULL_LOGITS = ("ckpt", "hf_offload")  # the others' loss never materialises the logits of the whole sequence
LIGER_VERSION = "0.8.5"  # pyproject.toml's bench extra
LIGER_HOW = ("apply_liger_kernel_to_llama(fused_linear_cross_entropy=True, rope=False, rms_norm=False, swiglu=False, "
             "cross_entropy=False, model=base)")
SHAPES = {"llama3_8b": LLAMA3_8B}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LEFT_OVER_BYTES = 256 << 20  # device memory still allocated before a build that is worth a warning
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------
# the model and the variants (kept free of this script's options: a multi-GPU script can reuse them)


def build_lora_llama(shape: dict, device: str, seq: int, lora_dtype: str = "fp32"):
    """A fresh random-init Llama of `shape` on `device` with PEFT LoRA (r 16, alpha 32, dropout 0) on
    every projection, the base frozen. lora_dtype "fp32": PEFT's default upcast of the adapters."""
    import peft

    model = build_llama(shape, device, seq)
    config = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS)
    return peft.get_peft_model(model, config, autocast_adapter_dtype=lora_dtype == "fp32").train()


def enable(model, variant: str, **ours_options):
    """Turns `variant` on for a fresh PEFT model: (our handle or None, what to remove afterwards,
    the call that turned it on). ours_options: apply()'s options for "ours" (host_budget_bytes,
    disk_dir)."""
    if variant in CHECKPOINTED:
        offload = {"offload": True} if variant.startswith("hf_offload") else {}
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}, **offload)
        how = "gradient_checkpointing_enable(use_reentrant=False" + (", offload=True)" if offload else ")")
        if variant in LIGER_VARIANTS:
            return None, [liger_fused_loss(model)], how + " + " + LIGER_HOW
        if variant == "ckpt_chunked":
            return None, [torch_offload.chunk_lm_loss(model)], how + " + chunk_lm_loss(model)"
        return None, [], how
    if variant == "ours_untiled":
        handle = torch_offload.apply(model, "hidden_states", chunked_loss=True)
        return handle, [handle], 'apply(model, "hidden_states", chunked_loss=True)'
    if variant == "ours":
        return enable_ours(model, **ours_options)
    if variant == "ours_every_layer_offloaded":
        return enable_ours(model, layer_offloading={"keep_layers_that_fit": False}, **ours_options)
    if variant == "ours_weights_on_gpu":
        return enable_ours(model, layer_offloading=False, **ours_options)
    if variant == "ours_loss_grads_in_backward":
        return enable_ours(model, chunked_loss={"grads_in_forward": False}, **ours_options)
    raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")


def import_liger():
    """Liger Kernel's apply_liger_kernel_to_llama, imported only where a Liger variant runs."""
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_llama
    except ImportError as error:
        raise ImportError(f"the Liger variants ({', '.join(LIGER_VARIANTS)}) need Liger Kernel: "
                          f"pip install torch_offload[bench] (liger-kernel=={LIGER_VERSION}); {error}") from error
    return apply_liger_kernel_to_llama


class InstanceForward:
    """Undoes Liger's patch of one model instance: the class's forward again. Also breaks the cycle
    (the model holds a method bound to itself) that would keep the model alive until gc runs."""

    def __init__(self, model):
        self.model = model

    def remove(self):
        vars(self.model).pop("forward", None)


def liger_fused_loss(model):
    """Liger's fused linear cross entropy on `model` (a Llama, PEFT-wrapped or not), as a Llama user
    turns it on, and nothing else of Liger: its RoPE, RMSNorm and SwiGLU stay off, so that only the
    loss differs from checkpointing with the model's own loss. Its loss is the model's: labels
    shifted, ignore_index -100, the mean over the tokens, accumulated in fp32.

    Given the instance, Liger replaces that instance's forward, not the class's: the other variants
    in this process keep the model's own loss, and PEFT calls it (LoraModel.forward calls
    self.model(...), which takes the instance's forward). train() checks that no logits come back."""
    apply_liger = import_liger()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    apply_liger(fused_linear_cross_entropy=True, rope=False, rms_norm=False, swiglu=False, cross_entropy=False,
                model=base)
    return InstanceForward(base)


def enable_ours(model, **options):
    handle = torch_offload.apply(model, "hidden_states", long_context=True, **options)
    said = "".join(f", {key}={value!r}" for key, value in options.items())
    return handle, [handle], f'apply(model, "hidden_states", long_context=True{said})'


def is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or (isinstance(error, RuntimeError)
                                                         and "out of memory" in str(error))


def offload_fields(handle, steps: int, written_before: int = 0) -> dict:
    """Our handle's statistics over the measured steps, per step where a count of bytes.
    `written_before`: the disk tier's bytes written before them (its total since apply())."""
    stats = handle.stats()
    row = {"offload_stats": stats, "host_peak_GB": stats.get("host_bytes_peak", 0) / GB,
           "to_host_GB_per_step": stats.get("bytes_to_host", 0) / steps / GB,
           "disk_written_GB_per_step": (stats.get("disk_bytes_written", 0) - written_before) / steps / GB,
           "spills": stats.get("spills", 0)}
    if handle.layers is not None:
        row["layer_stats"] = handle.layers.stats()
        row["weights_to_device_GB_per_step"] = row["layer_stats"].get("bytes_to_device", 0) / steps / GB
        row["kept_layers"] = len(handle.layers.kept_layers)
    try:
        row["explain"] = handle.explain()
    except (AttributeError, RuntimeError):  # only with long_context=True (and mode "auto")
        pass
    return row


# ------------------------------------------------------------------------------------------------
# one run: a fresh model under a variant, trained `warmup` + `steps` steps


def train(args, variant: str, seq: int, warmup: int, steps: int) -> dict:
    model = build_lora_llama(args.config, args.device, seq, args.lora_dtype)
    options = {}
    if args.host_budget_gb:
        options["host_budget_bytes"] = int(args.host_budget_gb * GB)
    if args.disk_dir:
        options["disk_dir"] = args.disk_dir
    handle, undo, how = enable(model, variant, **options)
    try:
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        ids = torch.randint(0, args.config["vocab"], (1, seq), device=args.device)

        def step(marks=None):
            if 0 < args.cpu_oom_above < seq:
                raise torch.OutOfMemoryError(f"out of memory (--cpu-oom-above {args.cpu_oom_above})")
            output = model(input_ids=ids, labels=ids)
            # Logits back from a fused or chunked loss: the model's own loss ran instead (the
            # patched forward is not the one called), and the comparison would be void.
            if variant not in FULL_LOGITS and output.logits is not None:
                raise RuntimeError(f"{variant}: the model returned the logits: its loss is not the fused or "
                                   "chunked one")
            mark_backward(marks)
            output.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for _ in range(warmup):
            step()
        if handle is not None:
            handle.manager.synchronize()
            torch_offload.reset_stats(handle.manager)
            if handle.layers is not None:
                handle.layers.manager.reset_stats()
            written_before = handle.stats().get("disk_bytes_written", 0)  # a total since apply()
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row = {"variant": variant, "seq": seq, "how": how, **timed_steps(step, steps, seq, args.device)}
        if handle is not None:
            handle.manager.synchronize()
            row.update(offload_fields(handle, steps, written_before))
        if args.snapshot:
            row["snapshot"] = snapshot_row(step, seq * args.config["hidden"] * 2)
        return row
    finally:
        # A failure here must not hide the step's own error (an out-of-memory one is a result).
        cleanup = [part.remove for part in reversed(undo)]
        if getattr(handle, "manager", None) is not None:
            cleanup.append(handle.manager.empty_pool)
        for done in cleanup:
            try:
                done()
            except Exception:  # noqa: BLE001
                traceback.print_exc()


def check_released(args, result: dict, what: str) -> None:
    """Frees what the last run left; warns when device memory is still allocated (a model kept
    alive by a reference cycle would inflate the next run's peak)."""
    release_memory(args.device)
    left = torch.cuda.memory_allocated() if args.device == "cuda" else 0
    if left > LEFT_OVER_BYTES:
        message = f"{left / GB:.2f} GB of device memory still allocated before {what}"
        log("WARNING:", message)
        result.setdefault("warnings", []).append(message)


def attempt(args, result: dict, variant: str, seq: int, warmup: int, steps: int) -> dict:
    """train() on fresh memory; an out-of-memory error gives {"error": "OOM"}."""
    check_released(args, result, f"{variant} at {seq}")
    try:
        return train(args, variant, seq, warmup, steps)
    except Exception as error:  # noqa: BLE001 (only out of memory is caught)
        if not is_oom(error):
            raise
        row = {"variant": variant, "seq": seq, "error": "OOM"}
    # Out of the except block: the traceback's frames, and the model in them, are gone.
    if args.device == "cuda":
        row["peak_at_oom_GB"] = torch.cuda.max_memory_allocated() / GB
    release_memory(args.device)
    return row


def past_deadline(args) -> bool:
    return args.deadline_s > 0 and time.monotonic() - args.t0 >= args.deadline_s


class StopSearch(Exception):
    pass


def search(args, result: dict, variant: str) -> dict:
    """--longest for one variant: {"longest", "bound" ("exact" or "at least"), "why", "tries"}."""
    entry = {"variant": variant, "tries": []}

    def fits(seq):
        if past_deadline(args):
            raise StopSearch(f"--deadline-s {args.deadline_s:g} reached")
        row = attempt(args, result, variant, seq, warmup=0, steps=1)
        entry["tries"].append({"seq": seq, "fits": "error" not in row, "step_s": row.get("step_s"),
                               "peak_allocated_GB": row.get("peak_allocated_GB", row.get("peak_at_oom_GB"))})
        log(f"longest {variant}: {seq} " + ("fits, step %.1f s" % row["step_s"] if "error" not in row else "OOM"))
        if "error" not in row and args.try_timeout_s and row["step_s"] > args.try_timeout_s:
            raise StopSearch(f"one step at {seq} took {row['step_s']:.0f} s > --try-timeout-s {args.try_timeout_s:g}")
        return "error" not in row

    try:
        entry["longest"] = longest_fitting(fits, args.longest_start, args.longest_step, args.longest_max)
        failed = [t["seq"] for t in entry["tries"] if not t["fits"]]
        entry["bound"] = "exact" if failed else "at least"
        entry["why"] = (f"{min(failed)} does not fit" if failed
                        else f"every length tried fits; the next doubling passes --longest-max {args.longest_max}")
    except Exception as error:  # noqa: BLE001 (StopSearch, or a failure that is not out of memory)
        if not isinstance(error, StopSearch):
            traceback.print_exc()
        entry["longest"] = max([t["seq"] for t in entry["tries"] if t["fits"]], default=0)
        entry["bound"], entry["why"] = "at least", str(error) if isinstance(error, StopSearch) else \
            f"failed: {type(error).__name__}: {str(error)[:300]}"
    fitting = [t for t in entry["tries"] if t["fits"] and t["seq"] == entry["longest"]]
    if fitting:
        entry["step_s"], entry["peak_allocated_GB"] = fitting[0]["step_s"], fitting[0]["peak_allocated_GB"]
    return entry


def timed(args, result: dict, variant: str, seq: int, **extra) -> None:
    """One timed cell of the table, appended to result["runs"]."""
    if past_deadline(args):
        row = {"variant": variant, "seq": seq, "error": "skipped (deadline)"}
    else:
        try:
            row = attempt(args, result, variant, seq, args.warmup, args.steps)
        except Exception as error:  # noqa: BLE001 (recorded; the other cells still run)
            traceback.print_exc()
            row = {"variant": variant, "seq": seq, "error": f"failed: {type(error).__name__}: {str(error)[:200]}"}
    row.update(extra)
    result["runs"].append(row)
    log({k: v for k, v in row.items() if k not in ("offload_stats", "layer_stats", "explain", "times_s")},
        f"{time.monotonic() - args.t0:.0f}s")


# ------------------------------------------------------------------------------------------------
# results


def environment(args) -> dict:
    import peft
    import transformers

    def git(*command):
        try:
            return subprocess.run(["git", *command], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    total = host_memory_bytes("MemTotal")
    host_ram = total / GB if total is not None else None
    return {"argv": sys.argv, "transformers": transformers.__version__, "peft": peft.__version__,
            "git_commit": git("rev-parse", "HEAD") or None,
            "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "host_ram_GB": host_ram, "shape": "tiny" if args.tiny else args.shape,
            "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "targets": LORA_TARGETS, "dtype": args.lora_dtype},
            "device": args.device, "warmup": args.warmup, "steps": args.steps,
            "rounds": dict(zip(args.seq_list, args.rounds_list)), "baseline": args.baseline}


def summarise(runs: list, baseline: str) -> list:
    """One row per (variant, seq) over the rounds of --seqs (runs with a "round"): step time min /
    median / max, the peaks (the largest of the rounds), median tokens/s and, per round where both
    ran, its tokens/s over `baseline`'s in that round: min / median / max of those ratios. A
    (variant, seq) whose every round failed keeps the first error."""
    groups, base = {}, {}
    for r in runs:
        if "round" not in r:
            continue
        groups.setdefault((r["variant"], r["seq"]), []).append(r)
        if r["variant"] == baseline and "error" not in r:
            base[(r["seq"], r["round"])] = r["tokens_per_s"]
    rows = []
    for (variant, seq), group in groups.items():
        done = [r for r in group if "error" not in r]
        row = {"variant": variant, "seq": seq, "rounds": len(done),
               "failed": [f"round {r['round']}: {r['error']}" for r in group if "error" in r]}
        if not done:
            rows.append(dict(row, error=group[0]["error"]))
            continue
        steps = [r["step_s"] for r in done]
        row.update(step_s_min=min(steps), step_s_median=statistics.median(steps), step_s_max=max(steps),
                   step_s_rounds=steps, tokens_per_s_median=statistics.median(r["tokens_per_s"] for r in done))
        for key in ("peak_allocated_GB", "peak_reserved_GB", "host_peak_GB"):
            if any(key in r for r in done):
                row[key] = max(r.get(key, 0) for r in done)
        ratios = [r["tokens_per_s"] / base[(seq, r["round"])] for r in done if (seq, r["round"]) in base]
        if ratios:
            row.update(ratio_min=min(ratios), ratio_median=statistics.median(ratios), ratio_max=max(ratios),
                       ratio_rounds=ratios)
        rows.append(row)
    return rows


def spread(row: dict, key: str, fmt: str) -> str:
    """min / median / max of `key` in a summary row, or "-"."""
    if row.get(key + "_min") is None:
        return "-"
    return " / ".join(format(row[f"{key}_{which}"], fmt) for which in ("min", "median", "max"))


def summary_table(result: dict) -> list:
    baseline = result["baseline"]
    lines = [f"| seq | variant | rounds | step s min / median / max | tok/s median | x {baseline} tok/s "
             "min / median / max | peak alloc GB | peak reserved GB |", "|---|---|---|---|---|---|---|---|"]
    for r in result["summary"]:
        if "error" in r:
            lines.append(f"| {r['seq']} | {r['variant']} | 0 | {r['error']} | | | | |")
            continue
        peaks = [format(r[key], ".2f") if key in r else "-" for key in ("peak_allocated_GB", "peak_reserved_GB")]
        failed = f" ({len(r['failed'])} failed)" if r["failed"] else ""
        lines.append(f"| {r['seq']} | {r['variant']} | {r['rounds']}{failed} | {spread(r, 'step_s', '.2f')} | "
                     f"{r['tokens_per_s_median']:.0f} | {spread(r, 'ratio', '.3f')} | {peaks[0]} | {peaks[1]} |")
    return lines


def markdown(result: dict) -> str:
    c = result["config"]
    lines = [f"# Long context on {result['gpu']}: {result['shape']} shape, LoRA", "",
             f"command: `{result['command']}`", "",
             f"model: {c['layers']} layers, hidden {c['hidden']}, ffn {c['intermediate']}, vocab {c['vocab']}; "
             f"LoRA r16 on every projection, adapters {result['lora']['dtype']}; batch 1, AdamW on the adapters "
             f"in every step. torch {result['torch']}, transformers {result['transformers']}, peft {result['peft']}, "
             f"commit {result['git_commit']}{' (modified)' if result['git_dirty'] else ''}, "
             f"host RAM {result['host_ram_GB'] or 0:.0f} GB"]
    if result["device"] == "cpu":
        lines += ["", "CPU run: device memory is not measured."]
    for warning in result.get("warnings", []):
        lines += ["", f"WARNING: {warning}"]
    if result.get("longest"):
        lines += ["", "## Longest sequence that trains one step", "",
                  "| variant | longest | bound | step s | peak alloc GB | tries |", "|---|---|---|---|---|---|"]
        for e in result["longest"]:
            peak = e.get("peak_allocated_GB")
            tries = ", ".join(f"{t['seq']}:{'fits' if t['fits'] else 'OOM'}" for t in e["tries"])
            step = e.get("step_s")
            lines.append(f"| {e['variant']} | {e['longest']} | {e['bound']} ({e['why']}) | "
                         f"{'-' if step is None else format(step, '.2f')} | "
                         f"{'-' if peak is None else format(peak, '.2f')} | {tries} |")
    if result["summary"] and (max(result["rounds"].values(), default=1) > 1
                              or any(r["variant"] == result["baseline"] for r in result["summary"])):
        lines += ["", "## Summary: interleaved rounds (odd rounds in reverse order), a fresh model per run", "",
                  f"x {result['baseline']}: in each round, the variant's tokens/s over {result['baseline']}'s; "
                  "min / median / max over the rounds. Peaks: the largest of the rounds.", ""]
        lines += summary_table(result)
    if result["runs"]:
        lines += ["", f"## Timed steps: every run, median of {result['steps']} after {result['warmup']} warm-up", ""]
        lines += table(result["runs"], [
            ("round", "round", "{}"),
            ("step s", "step_s", "{:.2f}"), ("tok/s", "tokens_per_s", "{:.0f}"),
            ("peak alloc GB", "peak_allocated_GB", "{:.2f}"), ("peak reserved GB", "peak_reserved_GB", "{:.2f}"),
            ("host peak GB", "host_peak_GB", "{:.2f}"), ("to host GB/step", "to_host_GB_per_step", "{:.2f}"),
            ("disk GB/step", "disk_written_GB_per_step", "{:.2f}"), ("spills", "spills", "{:.0f}"),
            ("weights H2D GB/step", "weights_to_device_GB_per_step", "{:.2f}"),
            ("layers kept on the GPU", "kept_layers", "{}"), ("at longest of", "at_longest_of", "{}")])
        explained = [r for r in result["runs"] if r.get("explain")]
        if explained:
            lines += ["", f"## {explained[-1]['variant']} at {explained[-1]['seq']}: handle.explain()", "",
                      explained[-1]["explain"]]
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path, png: bool = False) -> None:
    result["summary"] = summarise(result["runs"], result["baseline"])
    (out / "long_context.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "long_context.md").write_text(markdown(result))
    if png and result["runs"]:
        from torch_offload.bench.plot import plot
        c = result["config"]
        # One point per (variant, length): the median of the rounds.
        points = [dict(r, tokens_per_s=r.get("tokens_per_s_median")) for r in result["summary"]]
        points += [r for r in result["runs"] if "round" not in r]
        figure = dict(result, runs=points, model=f"{result['shape']} shape ({c['layers']} layers, LoRA r16)")
        try:
            plot(figure, out / "long_context.png")
        except RuntimeError as error:  # matplotlib missing: the JSON can be plotted elsewhere
            log(error)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, seqs="16384,32768,65536,131072,262144", steps=2, warmup=1)
    p.add_argument("--variants", default="ckpt,hf_offload,ours", help="comma-separated: " + ",".join(VARIANTS))
    p.add_argument("--rounds", default="1",
                   help="runs of every variant per --seqs length, in interleaved rounds: one number, or one per "
                        "length (3,2)")
    p.add_argument("--baseline", default="ckpt_liger", help="the variant the summary's tokens/s ratios divide by")
    p.add_argument("--shape", default="llama3_8b", choices=sorted(SHAPES))
    p.add_argument("--layers", type=int, default=0, help="this many decoder layers (a slice of the shape)")
    p.add_argument("--lora-dtype", default="fp32", choices=("fp32", "bf16"),
                   help="fp32: PEFT's default upcast of the adapters; bf16: the model's dtype")
    p.add_argument("--host-budget-gb", type=float, default=0.0,
                   help="ours: host memory for the boundaries, the rest spills to disk (default: from the RAM available)")
    p.add_argument("--disk-dir", default="", help="ours: where boundaries over the host budget spill (default: a temp folder)")
    p.add_argument("--longest", action="store_true", help="search the longest length that trains one step")
    p.add_argument("--longest-variants", default=None, help="variants searched (default: --variants)")
    p.add_argument("--longest-start", type=int, default=None, help="default 8192 (tiny: 32)")
    p.add_argument("--longest-step", type=int, default=None, help="default 8192 (tiny: 32)")
    p.add_argument("--longest-max", type=int, default=None, help="default 524288 (tiny: 256)")
    p.add_argument("--try-timeout-s", type=float, default=300.0,
                   help="a try whose step took longer stops that variant's search upward (0: no limit)")
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="start no try or timed run after this many seconds (0: none)")
    p.add_argument("--timed-longest", nargs="?", const="own", default=None, metavar="VARIANT",
                   help="after --longest, time each variant at its own longest length, or at VARIANT's")
    p.add_argument("--cpu-oom-above", type=int, default=0,
                   help="smoke tests: a step longer than this raises out of memory (exercises the bisection)")
    p.add_argument("--snapshot", action="store_true",
                   help="CUDA: after each timed run's measured steps, one more step under CUDA's allocation history; "
                        "its row's snapshot holds what is live at the forward's and the backward's peaks")
    args = p.parse_args()
    args.t0 = time.monotonic()
    shape = dict(SHAPES[args.shape])
    finish_run_args(args, shape, tiny_seqs="64,128")
    if args.layers:
        args.config = dict(args.config, layers=args.layers)
    defaults = (32, 32, 256) if args.tiny else (8192, 8192, 524288)
    for name, default in zip(("longest_start", "longest_step", "longest_max"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, default)
    variants = [v for v in args.variants.split(",") if v]
    searched = [v for v in (args.longest_variants or args.variants).split(",") if v] if args.longest else []
    for v in variants + searched:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}; expected some of {','.join(VARIANTS)}")
    if args.timed_longest not in (None, "own") and args.timed_longest not in searched:
        p.error(f"--timed-longest {args.timed_longest}: that variant is not searched (--longest, --longest-variants)")
    try:
        args.rounds_list = [int(n) for n in args.rounds.split(",")]
    except ValueError:
        p.error(f"--rounds {args.rounds}: expected a number, or one per --seqs length")
    if len(args.rounds_list) == 1:
        args.rounds_list *= len(args.seq_list)
    if len(args.rounds_list) != len(args.seq_list) or min(args.rounds_list, default=1) < 1:
        p.error(f"--rounds {args.rounds}: expected one number >= 1, or one per --seqs length ({len(args.seq_list)})")
    if args.snapshot and args.device != "cuda":
        p.error("--snapshot records CUDA's allocation history: run it with --device cuda")
    liger = [v for v in dict.fromkeys(variants + searched) if v in LIGER_VARIANTS]
    if liger and args.device != "cuda":
        p.error(f"{','.join(liger)}: Liger Kernel's fused linear cross entropy is a Triton kernel, which needs "
                "CUDA; run these variants with --device cuda")
    if liger:
        try:
            import_liger()
        except ImportError as error:
            p.error(str(error))
    if any(v.startswith("hf_offload") for v in variants + searched):
        from transformers import PreTrainedModel
        if "offload" not in inspect.signature(PreTrainedModel.gradient_checkpointing_enable).parameters:
            p.error("hf_offload: this transformers has no gradient_checkpointing_enable(offload=...)")

    out = output_dir(args, prefix="torch_offload_long_context_")
    result = new_result(args, **environment(args), longest=[])
    for variant in searched:
        result["longest"].append(search(args, result, variant))
        write(result, out)
    for seq, rounds in zip(args.seq_list, args.rounds_list):
        for index in range(rounds):
            # Odd rounds in reverse: no variant always runs first (or right after the same one).
            for variant in variants if index % 2 == 0 else variants[::-1]:
                timed(args, result, variant, seq, round=index + 1)
                write(result, out)
    if args.timed_longest:
        found = {e["variant"]: e["longest"] for e in result["longest"]}
        for variant in variants if args.timed_longest != "own" else searched:
            source = variant if args.timed_longest == "own" else args.timed_longest
            if found.get(source):
                timed(args, result, variant, found[source], at_longest_of=source)
                write(result, out)
    write(result, out, png=True)
    log(markdown(result))
    log(f"results in {out}")


if __name__ == "__main__":
    main()
