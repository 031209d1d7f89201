#!/usr/bin/env python3
"""Benchmark of selective offload against gradient checkpointing, one process, one model.

Model: the reference random-init LlamaForCausalLM (benchmarks/common.py build_llama: bf16, SDPA,
batch 1; --shape llama3_8b: the Llama-3-8B shape), forward+backward with labels=input_ids, at each sequence length in --seqs. Variants:

  ckpt        torch gradient checkpointing, non-reentrant (the model's gradient_checkpointing_enable)
  ckpt_re     torch gradient checkpointing, reentrant
  torch_sac   torch selective checkpointing keeping the fused SDPA outputs on the GPU
              (context_fn=create_selective_checkpoint_contexts(torch_offload.policies.attention_save))
  hidden      torch_offload.apply(model, mode="hidden_states")
  selective   torch_offload.apply(model, "selective", policy="attention"): each layer's input
              and its SDPA outputs (attention output, logsumexp) offloaded, everything else recomputed
  selective_qkv  the same with policy="attention_qkv": the q/k/v projection products offloaded too
  sel:POLICY  the same with any named policy, e.g. sel:attention+out_proj+fc2
  auto        torch_offload.apply(model, "auto"): its trial steps run first (not timed), then the
              mode it kept is timed; its plan is in the JSON
  hidden_re, selective_re, sel_re:POLICY, auto_re   the same with use_reentrant=True (our
              reentrant variant)
  VARIANT@GB  an offloading variant with keep_on_device_bytes=GB*1e9: the newest saves stay on the
              GPU uncopied (e.g. sel:attention+qkv+out_proj@1.3)
  VARIANT#N   an offloading variant on every block but the last N, which run unchecked (auto's
              unchecked tail, e.g. sel:attention+qkv+out_proj@0.61#1)
  sel:POLICY%N the last N checkpointed blocks keep their MLP's up/gate products on the GPU
              (POLICY+keep_fc1; e.g. sel:attention+qkv+out_proj%20@0.61#2)
  VARIANT/chunked, VARIANT/grads_in_forward   the variant with its loss in chunks (as --chunked-loss,
              for this variant only: ckpt/grads_in_forward beside ckpt in one process)

--chunked-loss: every variant (checkpointing too) computes the loss in chunks of 2048 tokens
(torch_offload.chunk_lm_loss): no logits are materialised; backward computes them again.
--chunked-loss grads_in_forward: the same with the loss's gradients computed in the forward.

Per run: median step time, tokens/s, peak allocated / reserved GPU memory, the manager's statistics;
per sequence length: tokens/s ratio and peak allocated difference versus ckpt, and selective's targets
(>= 1.08x ckpt at 16k, >= 1.15x at 64k, >= 1.00x at 4k; peak allocated <= hidden + 0.5 GB).
--rounds N runs the variants N times, interleaved; the summary keeps each variant's median round.
--noise-seq N first compares one step's bf16 gradients with checkpointing's (relative L2 error)
beside the noise floor (checkpointing against itself and against no checkpointing).

Writes <out>/selective_<gpu>[_llama3_8b].json and .md (without --out, into a new temporary folder).

GPU:       python3 benchmarks/bench_selective.py --out DIR
CPU smoke: python benchmarks/bench_selective.py --device cpu --tiny --out DIR
"""
import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from benchmarks.common import (GB, LLAMA3_8B, REFERENCE, add_run_args, build_llama, finish_run_args, flat_grads,  # noqa: E402
                               log, median_rounds, new_result, output_dir, release_memory, short_gpu_name, sync,
                               table, timed_steps)
from torch_offload import policies  # noqa: E402

VARIANTS = ("ckpt", "ckpt_re", "torch_sac", "hidden", "hidden_re", "selective", "selective_re", "selective_qkv",
            "auto", "auto_re")
TARGETS = {4096: 1.00, 16384: 1.08, 65536: 1.15}  # selective tokens/s over ckpt
MEMORY_SLACK_GB = 0.5  # selective peak allocated <= hidden's + this


def _reentrant(variant: str) -> bool:
    return variant.endswith("_re") or variant.startswith("sel_re:")


LOSSES = ("chunked", "grads_in_forward")  # chunked losses: VARIANT/LOSS and --chunked-loss LOSS


def _loss(variant: str):
    """VARIANT/LOSS -> (VARIANT, None or one of LOSSES); ValueError for another LOSS."""
    base, slash, loss = variant.partition("/")
    if slash and loss not in LOSSES:
        raise ValueError(loss)
    return base, loss or None


def chunk_loss(model, loss: str):
    """The model's loss in chunks (LOSSES: recomputed in backward, or its gradients in forward)."""
    return torch_offload.chunk_lm_loss(model, grads_in_forward=loss == "grads_in_forward")


def _tail(variant: str):
    """VARIANT#N -> (VARIANT, N blocks unchecked at the end); raises ValueError for a bad N."""
    base, hash_, n = _loss(variant)[0].partition("#")
    tail = int(n) if hash_ else 0
    if tail < 0:
        raise ValueError(n)
    return base, tail


def _kept_bytes(variant: str):
    """VARIANT@GB -> (VARIANT, bytes kept on the device); raises ValueError for a bad GB."""
    base, at, gb = _tail(variant)[0].partition("@")
    return base, int(float(gb) * GB) if at else 0


def valid_variant(variant: str) -> bool:
    try:
        tail = _tail(variant)[1]
        variant, keep = _kept_bytes(variant)
    except ValueError:
        return False
    if (keep or tail) and (variant.startswith(("ckpt", "torch_sac", "auto")) or keep < 0):
        return False
    if variant.startswith(("sel:", "sel_re:")):
        try:
            policy, kept_blocks = _kept_fc1_blocks(variant.partition(":")[2])
        except ValueError:
            return False
        return policy != "" and kept_blocks >= 0
    return variant in VARIANTS


def _kept_fc1_blocks(policy: str):
    """POLICY%N -> (POLICY, N last blocks that also keep their up/gate products); ValueError for a bad N."""
    base, percent, n = policy.partition("%")
    return base, int(n) if percent else 0


def enable(model, variant, auto_budget_gb=None):
    """Turns `variant` on; returns what undoes it."""
    tail = _tail(variant)[1]
    variant, keep = _kept_bytes(variant)
    kept = dict(keep_on_device_bytes=keep) if keep else {}
    if tail:
        kept["blocks"] = list(model.model.layers)[:-tail]
    reentrant = _reentrant(variant)
    if variant in ("ckpt", "ckpt_re"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        return model.gradient_checkpointing_disable
    if variant == "torch_sac":
        context_fn = functools.partial(create_selective_checkpoint_contexts, policies.attention_save)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False,
                                                                           "context_fn": context_fn})
        return model.gradient_checkpointing_disable
    if variant in ("hidden", "hidden_re"):
        return torch_offload.apply(model, mode="hidden_states", use_reentrant=reentrant, **kept).remove
    policy = {"selective": "attention", "selective_re": "attention", "selective_qkv": "attention_qkv"}.get(variant)
    if variant.startswith(("sel:", "sel_re:")):
        policy = variant.partition(":")[2]
    if policy is not None:
        policy, kept_fc1 = _kept_fc1_blocks(policy)
        n = len(kept.get("blocks", model.model.layers))
        per_block = dict(block_policies=[policy] * (n - kept_fc1) + [policy + "+keep_fc1"] * kept_fc1)
        return torch_offload.apply(model, "selective", use_reentrant=reentrant, **per_block, **kept).remove
    if variant in ("auto", "auto_re"):
        budget = {} if auto_budget_gb is None else dict(memory_budget_gb=auto_budget_gb)
        return torch_offload.apply(model, "auto", use_reentrant=reentrant, **budget).remove
    raise ValueError(f"bench_selective: unknown variant {variant!r}; expected one of {VARIANTS} or sel[_re]:POLICY")


def noise_floor(model, args) -> dict:
    """Gradients of one step at --noise-seq: each variant's relative L2 error against checkpointing,
    beside checkpointing against itself and against no checkpointing (the noise floor)."""
    ids = torch.randint(0, args.config["vocab"], (1, args.noise_seq), device=args.device)

    def grads(variant):
        undo = enable(model, variant) if variant != "none" else (lambda: None)
        try:
            model(input_ids=ids, labels=ids).loss.backward()
            flat = flat_grads(model)
            model.zero_grad(set_to_none=True)
            return flat
        finally:
            undo()

    reference = grads("ckpt")
    norm = reference.norm().item()
    error = lambda g: (g - reference).norm().item() / norm  # noqa: E731
    result = {"seq": args.noise_seq, "dtype": str(next(model.parameters()).dtype),
              "floor": max(error(grads("ckpt")), error(grads("none")))}
    # (a variant with its own loss is left out: the reference computes the model's loss)
    for variant in [v for v in args.variants.split(",")
                    if v not in ("ckpt", "ckpt_re", "torch_sac", "auto", "auto_re") and "/" not in v]:
        g = grads(variant)
        result[variant] = {"error": error(g), "bit_equal": bool(torch.equal(g, reference)),
                           "within_2x_floor": error(g) <= 2 * result["floor"] or bool(torch.equal(g, reference))}
    return result


def _auto_budget_gb(args, seq):
    """--auto-budget-gb: a number, or "ckpt": the peak of this process's last ckpt run at `seq`."""
    if args.auto_budget_gb != "ckpt":
        return None if args.auto_budget_gb is None else float(args.auto_budget_gb)
    peaks = [r["peak_allocated_GB"] for r in args.result["runs"]
             if r["variant"] == "ckpt" and r["seq"] == seq and "peak_allocated_GB" in r]
    if not peaks:
        raise SystemExit("bench_selective: --auto-budget-gb ckpt needs a ckpt run before auto (and a GPU)")
    return peaks[-1]


def run_variant(model, variant, seq, args):
    loss = _loss(variant)[1]
    chunked = None if loss is None else chunk_loss(model, loss)
    undo = enable(model, variant, _auto_budget_gb(args, seq) if variant.startswith("auto") else None)
    handle = getattr(undo, "__self__", None)
    auto = getattr(handle, "auto", None)
    ids = torch.randint(0, args.config["vocab"], (1, seq), device=args.device)

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    try:
        for _ in range(args.warmup):
            step()
        for _ in range(80):  # auto: its trial steps, then one more step closes the last trial
            if auto is None or auto.planned:
                break
            step()
        if auto is not None and auto.planned:
            step()  # warm the chosen mode
        sync(args.device)
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row = {"variant": variant, "seq": seq, **timed_steps(step, args.steps, seq, args.device)}
        if isinstance(handle, torch_offload.OffloadHandle):
            row["offload_stats"] = handle.stats()
        if auto is not None:
            row["auto_plan"] = [result.as_row() for result in auto.results]
            row["auto_chosen"], row["auto_budget_GB"] = auto.chosen.candidate, auto.budget_gb
        return row
    except torch.cuda.OutOfMemoryError:
        return {"variant": variant, "seq": seq, "error": "OOM"}
    finally:
        undo()
        if chunked is not None:
            chunked.remove()
        release_memory(args.device)


def evaluate(result):
    result["summary"] = median_rounds(result["runs"])
    by = {(r["variant"], r["seq"]): r for r in result["summary"] if "error" not in r}
    result["checks"] = []
    for seq in sorted({r["seq"] for r in result["runs"]}):
        base = by.get(("ckpt", seq))
        if base is None:
            continue
        check = {"seq": seq}
        for (variant, s), row in by.items():
            if s != seq or variant == "ckpt":
                continue
            row["speed_vs_ckpt"] = base["step_s"] / row["step_s"]
            check[f"{variant}_speed_vs_ckpt"] = row["speed_vs_ckpt"]
            if "peak_allocated_GB" in row:
                row["alloc_vs_ckpt_GB"] = row["peak_allocated_GB"] - base["peak_allocated_GB"]
        hidden = by.get(("hidden", seq))
        for name in ("selective", "selective_qkv", "selective_re"):
            selective = by.get((name, seq))
            if selective is not None and seq in TARGETS:
                check[f"{name}_speed_target_met"] = selective["speed_vs_ckpt"] >= TARGETS[seq]
            if selective is not None and hidden is not None and "peak_allocated_GB" in selective:
                check[f"{name}_memory_target_met"] = (selective["peak_allocated_GB"]
                                                      <= hidden["peak_allocated_GB"] + MEMORY_SLACK_GB)
        result["checks"].append(check)


def markdown(result):
    lines = [f"# Selective offload vs checkpointing on {result['gpu']}", "", f"command: `{result['command']}`", "",
             f"model: {result['config']}, torch {result['torch']}", ""]
    lines += table(result.get("summary", result["runs"]), [
        ("step s", "step_s", "{:.3f}"), ("tok/s", "tokens_per_s", "{:.0f}"), ("vs ckpt", "speed_vs_ckpt", "{:.3f}"),
        ("peak alloc GB", "peak_allocated_GB", "{:.2f}"), ("alloc - ckpt GB", "alloc_vs_ckpt_GB", "{:+.2f}"),
        ("peak reserved GB", "peak_reserved_GB", "{:.2f}")])
    if any(r.get("rounds", 1) > 1 for r in result.get("summary", [])):
        lines += ["", "step s: the median of the rounds (each round runs every variant once, in the order given); "
                  "per round in the JSON (step_s_rounds)"]
    for r in result["runs"]:
        if r.get("auto_plan"):
            budget = r.get("auto_budget_GB")
            lines += ["", f"seq {r['seq']} auto (budget {'-' if budget is None else f'{budget:.2f} GB'}): " + "; ".join(
                f"{p['candidate']}" + (f" keeping {p['keep_on_device_GB']:.2f} GB" if p.get("keep_on_device_GB") else "")
                + (f" with the last {p['tail_blocks']} blocks unchecked" if p.get("tail_blocks") else "")
                + (f" with the last {p['kept_mlp_blocks']} checkpointed blocks keeping their up/gate products "
                   f"({p['kept_GB']:.2f} GB)" if p.get("kept_mlp_blocks") else "")
                + f" {p['step_s']:.3f} s"
                + (f" {p['peak_allocated_GB']:.2f} GB" if "peak_allocated_GB" in p else "")
                + (" (chosen)" if p["chosen"] else "") for p in r["auto_plan"])]
    n = result.get("noise")
    if n:
        lines += ["", f"Gradients at seq {n['seq']} ({n['dtype']}), relative L2 error against checkpointing: noise "
                  f"floor {n['floor']:.3e}; " + "; ".join(
                      f"{v} {n[v]['error']:.3e} (bit-equal {n[v]['bit_equal']}, within 2x floor {n[v]['within_2x_floor']})"
                      for v in n if v not in ("seq", "dtype", "floor"))]
    for c in result.get("checks", []):
        lines += ["", f"seq {c['seq']}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                      for k, v in c.items() if k != "seq")]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, seqs="4096,16384,65536", steps=3)
    p.add_argument("--variants", default="ckpt,torch_sac,hidden,selective,selective_qkv,auto")
    p.add_argument("--rounds", type=int, default=1, help="run the variants this many times, interleaved")
    p.add_argument("--shape", default="reference", choices=("reference", "llama3_8b"))
    p.add_argument("--auto-budget-gb", default=None,
                   help="auto's memory_budget_gb: GB, or ckpt: the peak of the ckpt variant run before it at that "
                        "length (with the model's own loss, where auto's variant has its own: auto/grads_in_forward)")
    p.add_argument("--chunked-loss", nargs="?", const="chunked", choices=LOSSES,
                   help="every variant computes its loss in chunks")
    p.add_argument("--noise-seq", type=int, default=0,
                   help="first compare gradients at this length against the noise floor (0: skip)")
    parsed = p.parse_args()
    args = finish_run_args(parsed, LLAMA3_8B if parsed.shape == "llama3_8b" else REFERENCE)
    variants = args.variants.split(",")
    if args.chunked_loss and any("/" in v for v in variants):
        p.error("--chunked-loss chunks every variant's loss already; drop the /LOSS suffixes or the option")
    for variant in variants:
        if not valid_variant(variant):
            p.error(f"unknown variant {variant!r}; expected some of {','.join(VARIANTS)} or sel[_re]:POLICY")
    out = output_dir(args)
    name = short_gpu_name(args.device) + ("_llama3_8b" if args.shape == "llama3_8b" else "")
    name += {None: "", "chunked": "_chunked_loss", "grads_in_forward": "_loss_grads_in_forward"}[args.chunked_loss]
    result = args.result = new_result(args)
    model = build_llama(args.config, args.device, max(args.seq_list + [args.noise_seq]))
    if args.chunked_loss:
        chunk_loss(model, args.chunked_loss)

    def write():
        (out / f"selective_{name}.json").write_text(json.dumps(result, indent=1))
        (out / f"selective_{name}.md").write_text(markdown(result))

    t0 = time.time()
    if args.noise_seq:
        result["noise"] = noise_floor(model, args)
        log("noise", result["noise"])
        write()
    for seq in args.seq_list:
        for variant in [v for _ in range(args.rounds) for v in variants]:
            row = run_variant(model, variant, seq, args)
            result["runs"].append(row)
            log({k: v for k, v in row.items() if k not in ("offload_stats", "times_s")}, f"{time.time() - t0:.0f}s")
            evaluate(result)
            write()
    print(markdown(result))


if __name__ == "__main__":
    main()
