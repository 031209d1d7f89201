#!/usr/bin/env python3
"""Layer offloading example: LoRA training of a Llama whose frozen base weights live in host memory.

Trains the same PEFT LoRA model twice from the same weights and data: once with the frozen base on
the device, once with torch_offload.apply(model, "hidden_states", layer_offloading=True), and
prints the losses (identical), the peak device memory and the time per step of each.

On a GPU: a 16-layer Llama (hidden 2048) in bf16 at 4k tokens. On CPU: a tiny fp32 Llama; there is
no device memory to save there (the weights are "offloaded" to host memory from host memory), so
the example reports the bytes held by the engine instead.

    python examples/lora_layer_offload.py                # GPU if there is one, else CPU
    python examples/lora_layer_offload.py --device cpu
"""
import argparse
import copy
import sys
import time
from pathlib import Path

import torch

try:
    import torch_offload
except ImportError:  # running from a source checkout: examples/.. holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch_offload

import peft
from transformers import LlamaConfig, LlamaForCausalLM

GPU_SIZE = dict(layers=16, hidden=2048, intermediate=5632, heads=16, kv_heads=8, vocab=32000, seq=4096, steps=5)
CPU_SIZE = dict(layers=4, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=1024, seq=128, steps=3)


def build(size, device):
    config = LlamaConfig(vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["intermediate"],
                         num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                         num_key_value_heads=size["kv_heads"], max_position_embeddings=size["seq"],
                         attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16 if device == "cuda" else torch.float32)
    lora = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    return peft.get_peft_model(model, lora).train()


def train(model, ids, steps, device):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    losses, times = [], []
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return losses, min(times[1:] or times), peak


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    args = p.parse_args()
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    size = GPU_SIZE if device == "cuda" else CPU_SIZE
    base = build(size, device)
    ids = torch.randint(0, size["vocab"], (1, size["seq"]), device=device)

    resident = copy.deepcopy(base)
    torch_offload.apply(resident, "hidden_states")
    losses_r, step_r, peak_r = train(resident, ids, size["steps"], device)
    del resident

    offloaded = base
    handle = torch_offload.apply(offloaded, "hidden_states", layer_offloading=True)
    losses_o, step_o, peak_o = train(offloaded, ids, size["steps"], device)

    print(f"device {device}; frozen layer weights offloaded: {handle.layers.offloaded_bytes / 2**30:.3f} GiB")
    for name, losses, step, peak in (("frozen base on device", losses_r, step_r, peak_r),
                                     ("layer offloading", losses_o, step_o, peak_o)):
        memory = f"peak {peak:.2f} GiB" if peak is not None else "peak device memory: n/a on CPU"
        print(f"{name:>22}: {memory}, {step * 1e3:.1f} ms/step, {size['seq'] / step:.0f} tok/s, "
              f"losses {[round(x, 4) for x in losses]}")
    stats = handle.layers.stats()
    print(f"engine: {stats['host_bytes_in_use'] / 2**30:.3f} GiB held in host memory, "
          f"{stats['bytes_to_device'] / 2**30:.3f} GiB restored, {int(stats['prefetch_hits'])} prefetched restores")
    # The first loss is a forward on identical weights: equal to the bit. Later ones are equal on CPU;
    # on a GPU, flash attention's backward is not deterministic, so updates may differ in the last bits.
    if losses_o[0] != losses_r[0] or (device == "cpu" and losses_o != losses_r):
        raise SystemExit("losses differ: layer offloading changed the training")


if __name__ == "__main__":
    main()
