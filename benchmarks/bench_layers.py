#!/usr/bin/env python3
"""Benchmark of layer (frozen-weight) offloading: a random-init Llama-3-8B-shaped model in bf16
with LoRA adapters, trained with and without offload_layers, in one process.

Both variants checkpoint every decoder layer with torch_offload's hidden_states mode (without
checkpointing the 8B model's activations do not fit at 16k); the only difference is where the
frozen weights live. Reported per sequence length: median step time, tokens/s, peak allocated and
reserved GPU memory, weight bytes moved to the GPU per step, the transfer bound (those bytes /
measured pinned H2D bandwidth) and the targets:
  - peak allocated drops by >= 95% of (frozen decoder weight bytes - two layers' worth);
  - at 16k, throughput with layer offloading >= 0.95x without.
LoRA: rank-16 adapters on q/k/v/o/gate/up/down, written here (a frozen base Linear plus trainable
A and B) so that the benchmark needs no PEFT on the GPU machine; the tests cover PEFT models.

Writes <out>/layers_<gpu>.json and .md (without --out, into a new temporary folder).

GPU:       python3 benchmarks/bench_layers.py --out DIR
CPU smoke: python benchmarks/bench_layers.py --device cpu --tiny --out DIR
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from benchmarks.common import (GB, LLAMA3_8B, add_run_args, build_llama, finish_run_args, log, new_result,  # noqa: E402
                               output_dir, pinned_bandwidth, release_memory, short_gpu_name, sync, table,
                               timed_steps)

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """base(x) + (x @ A^T @ B^T) * scale with the base frozen."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float = 32.0):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features, dtype=base.weight.dtype,
                                               device=base.weight.device) / base.in_features ** 0.5)
        self.lora_b = nn.Parameter(torch.randn(base.out_features, rank, dtype=base.weight.dtype,
                                               device=base.weight.device) * 0.01)
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + nn.functional.linear(nn.functional.linear(x, self.lora_a), self.lora_b) * self.scale


def build_model(args):
    """The 8B-shaped model with every weight frozen and LoRA adapters on each layer's linears."""
    model = build_llama(args.config, args.device, max(args.seq_list))
    model.requires_grad_(False)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in LORA_TARGETS:
                if hasattr(parent, name):
                    setattr(parent, name, LoRALinear(getattr(parent, name), args.rank))
    return model


def frozen_layer_bytes(model):
    per_layer = [sum(p.numel() * p.element_size() for p in layer.parameters() if not p.requires_grad)
                 for layer in model.model.layers]
    return sum(per_layer), max(per_layer)


def run_variant(model, variant, seq, args):
    """variant: "resident" (weights stay on the GPU) or "layer_offload"."""
    handle = torch_offload.apply(model, "hidden_states", layer_offloading=variant == "layer_offload")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    ids = torch.randint(0, args.config["vocab"], (1, seq), device=args.device)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    try:
        for _ in range(args.warmup):
            step()
        sync(args.device)
        if handle.layers is not None:
            handle.layers.manager.reset_stats()
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row = {"variant": variant, "seq": seq, **timed_steps(step, args.steps, seq, args.device)}
        if handle.layers is not None:
            stats = handle.layers.stats()
            row["layer_stats"] = stats
            row["weights_h2d_GB_per_step"] = stats["bytes_to_device"] / args.steps / GB
        return row
    except torch.cuda.OutOfMemoryError:
        return {"variant": variant, "seq": seq, "error": "OOM"}
    finally:
        del optimizer
        handle.remove()
        release_memory(args.device)


def evaluate(result):
    bound_bytes = result["frozen_layer_bytes"] - 2 * result["largest_layer_bytes"]
    by = {(r["variant"], r["seq"]): r for r in result["runs"] if "error" not in r}
    for seq in sorted({r["seq"] for r in result["runs"]}):
        base, ours = by.get(("resident", seq)), by.get(("layer_offload", seq))
        if not base or not ours:
            continue
        check = {"seq": seq, "throughput_ratio": ours["tokens_per_s"] / base["tokens_per_s"]}
        if "peak_allocated_GB" in ours:
            drop = (base["peak_allocated_GB"] - ours["peak_allocated_GB"]) * GB
            check["allocated_drop_GB"] = drop / GB
            check["drop_over_target_bytes"] = drop / bound_bytes if bound_bytes > 0 else None
            check["drop_target_met"] = drop >= 0.95 * bound_bytes
        if "h2d_GBps" in result and "weights_h2d_GB_per_step" in ours:
            ours["transfer_bound_s"] = ours["weights_h2d_GB_per_step"] / result["h2d_GBps"]
            check["step_over_transfer_bound"] = ours["step_s"] / ours["transfer_bound_s"]
        if seq >= 16384:
            check["throughput_target_met"] = check["throughput_ratio"] >= 0.95
        result.setdefault("checks", []).append(check)


def markdown(result):
    lines = [f"# Layer offloading (LoRA, frozen base) on {result['gpu']}", "", f"command: `{result['command']}`", "",
             f"model: {result['config']}, LoRA rank {result['rank']}; frozen decoder weights "
             f"{result['frozen_layer_bytes'] / GB:.2f} GB (largest layer {result['largest_layer_bytes'] / GB:.3f} GB); "
             f"pinned H2D {result.get('h2d_GBps', float('nan')):.1f} GB/s", "",
             ""]
    lines += table(result["runs"], [
        ("step s", "step_s", "{:.3f}"), ("tok/s", "tokens_per_s", "{:.0f}"),
        ("peak alloc GB", "peak_allocated_GB", "{:.2f}"), ("peak reserved GB", "peak_reserved_GB", "{:.2f}"),
        ("weights H2D GB/step", "weights_h2d_GB_per_step", "{:.2f}"), ("transfer bound s", "transfer_bound_s", "{:.3f}")])
    for c in result.get("checks", []):
        lines.append("")
        lines.append("seq {seq}: ".format(**c) + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                            for k, v in c.items() if k != "seq"))
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, seqs="4096,16384", steps=3)
    p.add_argument("--variants", default="resident,layer_offload")
    p.add_argument("--rank", type=int, default=16)
    args = finish_run_args(p.parse_args(), LLAMA3_8B)

    result = new_result(args, rank=args.rank)
    name = short_gpu_name(args.device)
    if args.device == "cuda":
        result["h2d_GBps"] = pinned_bandwidth()["h2d_GBps"]
    out = output_dir(args)
    model = build_model(args)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["frozen_layer_bytes"], result["largest_layer_bytes"] = frozen_layer_bytes(model)
    log("parameters", result["parameters"], "frozen layer GB", result["frozen_layer_bytes"] / GB)

    def write():
        (out / f"layers_{name}.json").write_text(json.dumps(result, indent=1))
        (out / f"layers_{name}.md").write_text(markdown(result))

    t0 = time.time()
    for seq in args.seq_list:
        for variant in args.variants.split(","):
            row = run_variant(model, variant, seq, args)
            result["runs"].append(row)
            log({k: v for k, v in row.items() if k not in ("layer_stats", "times_s")}, f"{time.time() - t0:.0f}s")
            result.pop("checks", None)
            evaluate(result)
            write()
    print(markdown(result))


if __name__ == "__main__":
    main()
