#!/usr/bin/env python3
r"""torch_offload under FSDP2 (fully_shard), one process per GPU, launched with torchrun.

Model: the reference Llama (or --shape llama3_8b), random init, bf16 on CUDA (fp32 on CPU),
SDPA, batch 1 per rank, fully_shard on every decoder layer and the root (built on the meta device,
sharded, then materialised: no rank ever holds the whole model). Variants:
  ckpt       FSDP2 + torch gradient checkpointing (non-reentrant), the baseline
  hf_offload FSDP2 + transformers' offload=True (torch's save_on_cpu around each checkpointed layer:
             the layer inputs in host memory, copied on the compute stream); accelerate 1.15's
             fsdp_activation_checkpointing_offload is the same mechanism (torch's offload_wrapper
             around its checkpoint_wrapper)
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
  ckpt_chunked  torch checkpointing + apply(model, None, chunked_loss=True) after fully_shard (the
             chunked loss only, the model's checkpointing kept): the strongest baseline without us
  lc_after   apply(model, long_context=True) after fully_shard: boundaries offloaded, chunked loss,
             tiled MLP and norms; layer offloading stays off on sharded blocks (handle.explain(),
             recorded)
  none       FSDP2 alone: no checkpointing, nothing offloaded (the peer of all, which recomputes
             nothing either)
--lora: PEFT LoRA r 16, alpha 32 on q/k/v/o/gate/up/down, the base frozen (the adapters in fp32, as
PEFT upcasts them), wrapped on the meta device before fully_shard; ckpt variants call PEFT's
enable_input_require_grads as its recipes do.
--cpu-offload: FSDP2's CPUOffloadPolicy on every unit (sharded weights and gradients in host memory)
with the parameters in fp32 and, on CUDA, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32).
--optimizer adamw: AdamW (lr 1e-5) steps the trainable parameters after every backward (on the host
with --cpu-offload), so the peaks include it; each row records the optimizer.
--layers N: the shape with N decoder layers.
--phases: each measured step's forward, backward and optimizer seconds (phase_s, the slowest rank's),
the device synchronized between them: where a step's time goes, not a published step time.
A step is forward and backward (and the optimizer's step with --optimizer adamw). Publish peaks from
one process per variant: in one process, a model that something still refers to adds to every later
variant's peak. Host memory per rank: the process's peak RSS since it started (ru_maxrss: a
lifetime peak, so the largest variant run so far) and the host's MemAvailable before the model is
built and after the measured steps (the whole node's, so the other ranks' use shows too); with
--cpu-offload, the host bytes per part computed from the rank's shards (host_parts_GB).
Per rank: median step time, tokens/s, peak allocated / reserved GPU memory over the measured steps
(and the allocated peak by the end of the first measured step's forward), bytes moved (manager
stats). Per variant against ckpt: tokens/s ratio and peak memory freed over
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
LoRA on the 8B shape at 64K tokens per rank (2x H200, about 5 minutes):
    torchrun --standalone --nproc_per_node=2 benchmarks/bench_fsdp2.py --lora --shape llama3_8b \
        --seqs 65536 --variants ckpt,ckpt_chunked,lc_after --optimizer adamw --warmup 1 --steps 2 \
        --deadline-s 300 --timeout-s 180 --out DIR
  Estimate: a step of the 8B shape + LoRA at 64K with checkpointing is ~18.5 s on one H200 and the
  full model's FSDP2 step at 64K on 2x H200 16.5 s (records/fsdp2_llama3_8b_64k_2xh200.json), so
  ~20 s per step here (lc_after's tiles and offload perhaps ~10% more); 3 steps per variant and a
  build of ~10-20 s (meta, then each rank's shards initialised on the GPU): ~75 s per variant,
  ~4-5 minutes with start-up. The gradient check of the same setup: fsdp2_gradients.py.
Every parameter trained, FSDP2 keeping it in host memory, at 64K tokens per rank (2x H200, 256 GiB
of host RAM; about 6 minutes):
    OMP_NUM_THREADS=16 torchrun --standalone --nproc_per_node=2 benchmarks/bench_fsdp2.py \
        --shape llama3_8b --cpu-offload --optimizer adamw --seqs 65536 --variants ckpt,lc_after \
        --warmup 1 --steps 2 --deadline-s 300 --timeout-s 180 --out DIR
  OMP_NUM_THREADS: torchrun sets 1 thread per rank, and AdamW's step and the random init run on the
  host: 16 threads per rank on the 32 cores. Host bytes per rank (4.0B parameters, half the 8.03B):
  fp32 weights 16.1 GB + fp32 gradients 16.1 GB + AdamW's moments 32.1 GB = 64.2 GB, and
  lc_after's boundaries 32 x 65536 x 4096 x 2 = 17.2 GB: ~81 GB per rank, ~163 GB for the node
  (CPUOffloadPolicy pins the weights and gradients). Estimate per step: the compute of the full
  model's 16.5 s, the fp32 shards copied to the GPU at every unshard (16 GB per rank, twice) and the
  gradients back (16 GB), mostly overlapped, and AdamW on the host over 4.0B fp32 parameters per rank
  (~290 GB of memory traffic: ~5-15 s with 16 threads; ~30 s or more with one): ~25-45 s; 3 steps
  and a build of ~20-40 s (the fp32 shards initialised on the host, AdamW's state allocated at the
  first step) per variant: ~2.5 minutes per variant, ~6 minutes in all. If the first variant takes
  past 5 minutes (a slower host), the second is skipped and recorded as such; then run it alone
  (--variants lc_after), or with --layers 16 (half the layers, about half the time and host memory).
Both: --deadline-s 300 starts no variant after 5 minutes, so that one as long as those before still
ends within 10; --timeout-s 180 (collectives): a hung rank ends the run in 3 minutes, not 15 (the
longest wait between collectives is a build or a host AdamW step).
CPU smoke:     torchrun --nproc_per_node=2 benchmarks/bench_fsdp2.py --device cpu --tiny --longest --out DIR
               ... --device cpu --tiny --lora --variants ckpt,ckpt_chunked,lc_after --optimizer adamw
               ... --device cpu --tiny --cpu-offload --optimizer adamw --variants ckpt,lc_after
"""
import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from torch_offload.hooks.link_budget import LinkBudget, PolicyLinkBudget  # noqa: E402
from torch_offload.hooks.node_link import link_bandwidth  # noqa: E402
from benchmarks.common import (GB, SHAPES, TINY, add_run_args, agree, build_llama, exit_without_finalising,  # noqa: E402
                               finish_run_args, gather, init_ranks, log, longest_fitting, new_result, output_dir,
                               past_deadline, release_memory, short_gpu_name, sync, table, timed_steps,
                               worst_rank)

VARIANTS = ("ckpt", "hf_offload", "hs_before", "hs_after", "hs_chunked", "all", "all_link", "sel", "sel_link",
            "sel_qkv", "sel_qkv_link", "auto", "ckpt_chunked", "lc_after", "none")
# Variants with the model's own gradient checkpointing.
CHECKPOINTED = ("ckpt", "hf_offload", "ckpt_chunked")
# Variants applied after fully_shard: (mode, options); mode "default": apply's default mode, called
# as a user writes it (apply(model, long_context=True)); mode None: no activation offloading.
APPLIED_AFTER = {
    "hs_after": ("hidden_states", {}),
    "all_link": ("all", {"keep_on_device_bytes": "auto"}),
    "sel": ("selective", {}),
    "sel_link": ("selective", {"link_throttle": True}),
    "sel_qkv": ("selective", {"policy": "attention+qkv+out_proj"}),
    "sel_qkv_link": ("selective", {"policy": "attention+qkv+out_proj", "link_throttle": True}),
    "auto": ("auto", {}),
    "ckpt_chunked": (None, {"chunked_loss": True}),  # the chunked loss only; the model's checkpointing stays
    "lc_after": ("default", {"long_context": True}),
}
# Variants whose loss is chunked: the model returns no logits.
CHUNKED = ("hs_chunked", "ckpt_chunked", "lc_after")
# --tiny: tiles and loss chunks of 24 tokens, so that 64 tokens per rank take several of each.
TINY_LONG_CONTEXT = {"long_context": {"tile_tokens": 24}, "chunked_loss": 24}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
AUTO_MAX_WARMUP = 80  # steps auto may take to choose


def build_model(args, shape: dict, seq: int):
    """On the meta device: (the model to train, the LlamaForCausalLM inside it to shard). --lora:
    PEFT's LoRA around the Llama (meta adapters too, materialised with the rest)."""
    llama = build_llama(shape, "meta", seq, dtype=args.dtype)
    if not args.lora:
        return llama, llama
    import peft

    config = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS)
    return peft.get_peft_model(llama, config).train(), llama


def fsdp_options(args) -> dict:
    """fully_shard's options: --cpu-offload keeps the sharded fp32 weights and gradients in host memory
    (pinned on CUDA) and, on CUDA, computes in bf16 and reduces the gradients in fp32."""
    if not args.cpu_offload:
        return {}
    options = {"offload_policy": CPUOffloadPolicy(pin_memory=args.device == "cuda")}
    if args.device == "cuda":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return options


def build_sharded(args, shape: dict, seq: int, variant: str):
    """A fresh model under `variant`, fully_shard per decoder layer and root; returns (model, handle)."""
    model, llama = build_model(args, shape, seq)
    handle = None
    if variant in CHECKPOINTED:
        offload = {"offload": True} if variant == "hf_offload" else {}
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}, **offload)
        if args.lora:  # the frozen embedding's output needs grad for the checkpointed blocks (PEFT's recipe)
            model.enable_input_require_grads()
    elif variant == "hs_before":
        handle = torch_offload.apply(model, "hidden_states")
    elif variant == "hs_chunked":
        handle = torch_offload.apply(model, "hidden_states", chunked_loss=True)
    options = fsdp_options(args)
    for layer in llama.model.layers:
        fully_shard(layer, **options)
    fully_shard(llama, **options)
    # CPUOffloadPolicy wants the shards on the host; the buffers (rotary) are rebuilt on the device below.
    llama.to_empty(device="cpu" if args.cpu_offload else args.device)
    with torch.no_grad():  # random init of each rank's shards (the LoRA B matrices too: a benchmark)
        for name, p in llama.named_parameters():
            if "norm" in name:
                p.to_local().fill_(1.0)
            else:
                p.to_local().normal_(0.0, 0.02)
        with torch.device(args.device):
            llama.model.rotary_emb = type(llama.model.rotary_emb)(llama.config)
    if variant in APPLIED_AFTER:
        mode, options = APPLIED_AFTER[variant]
        if mode == "all" and args.tiny:
            options = dict(options, min_bytes=0)
        if variant == "lc_after" and args.tiny:
            options = dict(options, **TINY_LONG_CONTEXT)
        if variant == "ckpt_chunked" and args.tiny:
            options = dict(options, chunked_loss=TINY_LONG_CONTEXT["chunked_loss"])
        if mode == "default":
            handle = torch_offload.apply(model, **options)
        else:
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
        return handle.link_budget.decided
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


def host_available_GB():
    """The host's MemAvailable (/proc/meminfo) in GB; None where there is none."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    return None


def host_parts(args, model, shape: dict, seq: int, variant: str) -> dict:
    """--cpu-offload: the host bytes of this rank's parts in GB, computed from its shards: weights and
    gradients (fp32: the parameters' dtype), AdamW's two moments, and the boundaries our variants
    offload (layers x seq x hidden in the compute dtype)."""
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    parts = {"weights": sum(p.to_local().numel() * p.element_size() for p in params),
             "gradients": sum(p.to_local().numel() * p.element_size() for p in trainable)}
    if args.optimizer == "adamw":
        parts["adamw_moments"] = 2 * parts["gradients"]
    if variant not in CHECKPOINTED + ("none",):
        parts["boundaries"] = shape["layers"] * seq * shape["hidden"] * args.elem_bytes
    return {part: size / GB for part, size in parts.items()}


class PhaseClock:
    """--phases: the wall time of each part of a step (forward, backward, optimizer), the device
    synchronized at each boundary so that a part's queued kernels count in it. The syncs cost the
    overlap across the boundaries, so the step times of such a run are not the published ones."""

    def __init__(self, device: str):
        self.device, self.laps, self.since = device, {}, 0.0

    def _now(self) -> float:
        sync(self.device)
        return time.perf_counter()

    def start(self):
        self.since = self._now()

    def lap(self, name: str):
        now = self._now()
        self.laps.setdefault(name, []).append(now - self.since)
        self.since = now

    def medians(self) -> dict:
        return {name: statistics.median(times) for name, times in self.laps.items()}


def run(args, shape: dict, seq: int, variant: str, warmup: int, steps: int) -> dict:
    """One variant at one length on this rank: timings, memory, bytes moved; or {"error": "OOM"}."""
    row = {"variant": variant, "seq": seq, "rank": dist.get_rank(), "optimizer": args.optimizer,
           "host_available_before_GB": host_available_GB()}
    model = handle = optimizer = None
    try:
        model, handle = build_sharded(args, shape, seq, variant)
        if handle is not None and handle.config is not None and handle.config.long_context:
            # what long_context turned on, and why layer offloading stays off
            row["explain"] = handle.explain()
        if args.cpu_offload:
            row["host_parts_GB"] = host_parts(args, model, shape, seq, variant)
        if args.optimizer == "adamw":
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        ids = torch.randint(0, shape["vocab"], (1, seq), device=args.device)

        clock = PhaseClock(args.device) if args.phases else None
        # The allocated peak up to the end of each forward; the first measured step's, beside the
        # step's peak, says whether that falls in the forward (the saves all live) or later.
        forward_peaks = []

        def step():
            if clock:
                clock.start()
            output = model(input_ids=ids, labels=ids)
            # Logits back: the model's own loss ran, not the chunked one, and the row would be void.
            if variant in CHUNKED and output.logits is not None:
                raise RuntimeError(f"{variant}: the model returned the logits: its loss is not the chunked one")
            if clock:
                clock.lap("forward")
            if args.device == "cuda":
                forward_peaks.append(torch.cuda.max_memory_allocated())
            output.loss.backward()
            del output
            if clock:
                clock.lap("backward")
            if optimizer is not None:
                optimizer.step()
            model.zero_grad(set_to_none=True)
            if clock:
                clock.lap("optimizer")

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
        if clock:
            clock.laps.clear()  # the measured steps only
        forward_peaks.clear()  # the measured steps only
        row.update(timed_steps(step, steps, seq, args.device))
        if forward_peaks:
            row["forward_peak_allocated_GB"] = forward_peaks[0] / GB
        if clock:
            row["phase_s"] = clock.medians()
        if handle is not None:
            stats = handle.stats()
            row["GB_to_host_per_step"] = stats.get("bytes_to_host", 0) / steps / GB
            row["GB_to_device_per_step"] = stats.get("bytes_to_device", 0) / steps / GB
            row["stats"] = stats
        if optimizer is not None:  # the steps AdamW took (warm-up and measured): it ran
            row["optimizer_steps"] = max((int(state["step"]) for state in optimizer.state.values()), default=0)
        row["host_available_after_GB"] = host_available_GB()
    except torch.OutOfMemoryError:
        row["error"] = "OOM"
    finally:
        if handle is not None:
            if handle.manager is not None:
                handle.manager.empty_pool()
            handle.remove()  # its hooks and wrappers, which refer to the model
        del model, handle, optimizer
        release_memory(args.device)
    row["host_rss_peak_GB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB  # KiB on Linux
    return row


def summarise(rows: list, shape: dict, elem_bytes: int) -> dict:
    """One line for the table from every rank's row: the worst rank's memory and time."""
    first = rows[0]
    out = {"variant": first["variant"], "seq": first["seq"], "per_rank": rows}
    errors = sorted({r["error"] for r in rows if "error" in r})
    if errors:
        out["error"] = ",".join(errors)
        return out
    out.update(worst_rank(rows, keys=("peak_allocated_GB", "peak_reserved_GB", "forward_peak_allocated_GB",
                                      "step_s", "GB_to_host_per_step", "host_rss_peak_GB")))
    out["optimizer"] = first["optimizer"]
    out["tokens_per_s_total"] = sum(r["seq"] for r in rows) / out["step_s"]
    out["boundary_GB"] = shape["layers"] * first["seq"] * shape["hidden"] * elem_bytes / GB
    # MemAvailable is the node's: its largest drop any rank saw, from before the build to after the steps.
    drops = [r["host_available_before_GB"] - r["host_available_after_GB"] for r in rows
             if r.get("host_available_before_GB") is not None and r.get("host_available_after_GB") is not None]
    if drops:
        out["host_available_drop_GB"] = max(drops)
    if "phase_s" in first:  # each part's slowest rank
        out["phase_s"] = {name: max(r["phase_s"][name] for r in rows) for name in first["phase_s"]}
    if "host_parts_GB" in first:  # the node's: every rank's parts summed
        out["host_parts_GB"] = {part: sum(r["host_parts_GB"][part] for r in rows) for part in first["host_parts_GB"]}
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
        ("freed / boundary", "freed_over_boundary", "{:.3f}"), ("to host GB/step", "GB_to_host_per_step", "{:.2f}"),
        ("optimizer", "optimizer", "{}"), ("host RSS peak GB", "host_rss_peak_GB", "{:.1f}"),
        ("host avail. drop GB", "host_available_drop_GB", "{:.1f}")])
    parts = [r for r in result["runs"] if "host_parts_GB" in r]
    if parts:
        lines += ["", "Host bytes per part, all ranks (computed from the shards, GB):", ""]
        for r in parts:
            sizes = ", ".join(f"{part} {size:.1f}" for part, size in r["host_parts_GB"].items())
            lines.append(f"- {r['variant']} at {r['seq']}: {sizes}")
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
    # The default leaves out the variants added for LoRA, CPUOffloadPolicy and `all`'s peer: the
    # default commands above keep their time.
    p.add_argument("--variants", default=",".join(v for v in VARIANTS if v not in ("ckpt_chunked", "lc_after", "none")))
    p.add_argument("--all-seqs", default="16384", help="lengths at which the all variant runs")
    p.add_argument("--longest", action="store_true", help="run the longest-sequence search")
    p.add_argument("--longest-shape", default="llama3_8b", choices=sorted(SHAPES))
    p.add_argument("--longest-ours", default="hs_before,hs_chunked",
                   help="variants searched after ckpt, comma-separated: " + ",".join(VARIANTS[1:]))
    p.add_argument("--longest-start", type=int, default=32768)
    p.add_argument("--longest-step", type=int, default=4096)
    p.add_argument("--longest-max", type=int, default=262144)
    p.add_argument("--lora", action="store_true", help="PEFT LoRA (r 16) on every projection, the base frozen")
    p.add_argument("--cpu-offload", action="store_true",
                   help="FSDP2's CPUOffloadPolicy on every unit, fp32 parameters (bf16 compute on CUDA)")
    p.add_argument("--optimizer", default="none", choices=("none", "adamw"),
                   help="adamw: an AdamW step (lr 1e-5) after every backward")
    p.add_argument("--layers", type=int, default=0, help="decoder layers of the shape (0: the shape's own)")
    p.add_argument("--phases", action="store_true",
                   help="record each measured step's forward, backward and optimizer seconds (phase_s; the "
                        "device synchronized between them)")
    p.add_argument("--timeout-s", type=int, default=900, help="collective timeout")
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="start no run after this many seconds (0: none); what was skipped is recorded")
    args = finish_run_args(p.parse_args(), SHAPES[p.parse_args().shape])
    if args.layers:
        args.config = dict(args.config, layers=args.layers)
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:  # a misspelt variant would otherwise run as FSDP2 alone
        p.error(f"--variants {args.variants}: unknown variant(s) {unknown}; choose from {VARIANTS}")
    args.longest_variants = ["ckpt"] + [v for v in args.longest_ours.split(",") if v]
    unknown = [v for v in args.longest_variants[1:] if v not in VARIANTS[1:]]
    if unknown:
        p.error(f"--longest-ours {args.longest_ours}: unknown variant(s) {unknown}; choose from {VARIANTS[1:]}")
    if args.tiny:
        args.all_seqs = ",".join(str(s) for s in args.seq_list)
        args.longest_start, args.longest_step, args.longest_max = 64, 32, 256
    args.start = time.monotonic()
    # --cpu-offload: fp32 parameters, so that the host holds fp32 weights, gradients and AdamW's state
    # (on CUDA the compute is bf16 by MixedPrecisionPolicy).
    args.dtype = torch.bfloat16 if args.device == "cuda" and not args.cpu_offload else torch.float32
    elem_bytes = args.elem_bytes = 2 if args.device == "cuda" else 4  # the activations' (compute) dtype

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
        if args.layers:
            shape = dict(shape, layers=args.layers)
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
