#!/usr/bin/env python3
"""torch_offload demo: the same short training run three ways, on the same weights and data.

  none            plain training: every activation stays in device memory
  checkpointing   torch gradient checkpointing (non-reentrant): each decoder layer is recomputed in
                  backward; its input (the hidden states) stays in device memory
  hidden_states   torch_offload.apply(model, mode="hidden_states"): checkpointing, with each layer's
                  input moved to pinned host memory in forward and prefetched back in backward

For each: peak memory, time per step, tokens/s and the loss of every step (the same in all three:
the recompute does the same arithmetic, and the offloaded tensors come back bit for bit).

On a GPU the model is a 12-layer Llama (hidden 2048) in bf16 at 16k tokens, and memory is
torch.cuda.max_memory_allocated. On CPU it is a tiny fp32 Llama that finishes in seconds; there is
no GPU memory to measure, and the "offload" is a host-to-host copy (same code path, no saving), so
the demo reports how many bytes the engine held in host memory instead.

    python examples/demo.py                 # GPU if there is one, else CPU
    python examples/demo.py --device cpu    # force CPU
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

try:
    import torch_offload
except ImportError:  # running from a source checkout: examples/.. holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch_offload

from transformers import LlamaConfig, LlamaForCausalLM

GPU_SIZE = dict(layers=12, hidden=2048, intermediate=5632, heads=16, kv_heads=8, vocab=32000,
                seq=16384, batch=1, steps=6)
CPU_SIZE = dict(layers=4, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=1024,
                seq=256, batch=2, steps=5)
MODES = ("none", "checkpointing", "hidden_states")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    for name in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "seq", "batch",
                 "steps"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help="default: %s on GPU, %s on CPU" % (GPU_SIZE[name], CPU_SIZE[name]))
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads on CPU runs (default 1: the model is tiny, and OpenMP threads "
                        "stall badly when a small machine is busy with other work)")
    args = p.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    defaults = GPU_SIZE if args.device == "cuda" else CPU_SIZE
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def build_model(args, device, dtype):
    config = LlamaConfig(
        num_hidden_layers=args.layers, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=args.seq, use_cache=False, attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    return model.train()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def train(model, mode, batch, initial_state, args, device):
    """Runs args.steps optimizer steps from `initial_state`; returns losses, timings and memory."""
    model.load_state_dict(initial_state)
    model.zero_grad(set_to_none=True)
    handle = None
    if mode == "checkpointing":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif mode == "hidden_states":
        handle = torch_offload.apply(model, mode="hidden_states")  # <- the one line that offloads
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for _ in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())

    result = {
        "losses": losses,
        # the first step pays one-time costs (kernel selection, pinned buffer allocation)
        "step_s": statistics.median(times[1:] if len(times) > 1 else times),
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
    }
    if handle is not None:
        handle.manager.synchronize()
        result["offload"] = handle.stats()
        handle.remove()
    if model.is_gradient_checkpointing:
        model.gradient_checkpointing_disable()
    del optimizer
    return result


def main():
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t_start = time.perf_counter()
    model = build_model(args, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    initial_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    batch = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(device)
    tokens = args.batch * args.seq
    boundary = args.layers * tokens * args.hidden * torch.empty(0, dtype=dtype).element_size()

    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"torch_offload demo on {where}: Llama {args.layers} layers, hidden {args.hidden}, "
          f"{n_params / 1e6:.1f}M params, {str(dtype).replace('torch.', '')}, batch {args.batch} x "
          f"{args.seq} tokens, {args.steps} AdamW steps per mode")
    print(f"checkpoint-boundary activations (layers x tokens x hidden): {boundary / 1e6:.1f} MB per step")
    if device.type != "cuda":
        print("running on CPU: GPU memory is n/a; offloading copies host to host here (no saving), "
              "the engine's host bytes are shown instead")
    print()

    results = {}
    for mode in MODES:
        results[mode] = r = train(model, mode, batch, initial_state, args, device)
        mem = (f"peak GPU memory {r['peak_gpu_bytes'] / 1e9:6.2f} GB" if r["peak_gpu_bytes"] is not None
               else "peak GPU memory n/a (CPU)")
        line = (f"{mode:>14}: {mem} | {r['step_s'] * 1e3:8.1f} ms/step | "
                f"{tokens / r['step_s']:9.0f} tokens/s | losses " + " ".join(f"{x:.4f}" for x in r["losses"]))
        print(line)
        if "offload" in r:
            s = r["offload"]
            print(f"{'':>14}  offload engine: {s['bytes_to_host'] / 1e6:.1f} MB to host, "
                  f"{s['bytes_to_device'] / 1e6:.1f} MB back, host buffers peak "
                  f"{s['host_bytes_peak'] / 1e6:.1f} MB ({'pinned' if s.get('pinned') else 'pageable'}), "
                  f"{s['prefetch_hits']:.0f}/{s['restores']:.0f} restores prefetched, compute stream "
                  f"waited {s['compute_wait_ms']:.1f} ms")

    none, ckpt, ours = (results[m] for m in MODES)
    print()
    worst = max(abs(a - b) for m in MODES for a, b in zip(results[m]["losses"], none["losses"]))
    print("losses identical across modes" if worst == 0.0 else
          f"largest loss difference from plain training: {worst:.3e}")
    if ours["peak_gpu_bytes"] is not None:
        saved = ckpt["peak_gpu_bytes"] - ours["peak_gpu_bytes"]
        print(f"peak GPU memory: {ours['peak_gpu_bytes'] / 1e9:.2f} GB offloaded vs "
              f"{ckpt['peak_gpu_bytes'] / 1e9:.2f} GB with gradient checkpointing "
              f"({saved / 1e9:.2f} GB less; boundary activations {boundary / 1e9:.2f} GB) and "
              f"{none['peak_gpu_bytes'] / 1e9:.2f} GB without either")
    kept = ours["offload"]["host_bytes_peak"]
    print(f"offloading kept {kept / 1e6:.1f} MB of activations in host memory; speed "
          f"{ckpt['step_s'] / ours['step_s']:.2f}x of gradient checkpointing "
          f"({none['step_s'] / ours['step_s']:.2f}x of plain training)")
    print(f"(total {time.perf_counter() - t_start:.1f} s)")


if __name__ == "__main__":
    main()
