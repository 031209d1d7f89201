"""What the benchmark scripts share: model shapes, the random-init Llama builder, pinned-memory
bandwidth, and small helpers. Import after putting the repository root on sys.path."""
import time

import torch

GB = 1e9
# DESIGN.md's reference model (1.26B) and the Llama-3-8B shape; TINY for CPU smoke runs.
REFERENCE = dict(layers=24, hidden=2048, intermediate=5632, heads=16, kv_heads=8, vocab=32000)
LLAMA3_8B = dict(layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, vocab=128256)
TINY = dict(layers=3, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=512)


def log(*a):
    print(*a, flush=True)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def gpu_name(device) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def short_gpu_name(device) -> str:
    """"h100" for "NVIDIA H100 80GB HBM3": the suffix of result file names."""
    return "cpu" if device == "cpu" else gpu_name(device).split()[1].split("-")[0].lower()


def build_llama(shape: dict, device: str, max_positions: int):
    """A random-init LlamaForCausalLM (SDPA, no KV cache) in training mode: bf16 on CUDA (built in
    bf16 so an 8B model never exists in fp32), fp32 on CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                         intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
                         num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                         max_position_embeddings=max_positions, attn_implementation="sdpa", use_cache=False)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.train()


def pinned_bandwidth(nbytes: int = 1 << 30, repeats: int = 3) -> dict:
    """Best-of-`repeats` pinned host<->device copy bandwidth in GB/s: {"d2h_GBps", "h2d_GBps"}."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = {}
    for name, dst, src in (("d2h", host, dev), ("h2d", dev, host)):
        best = float("inf")
        for _ in range(repeats):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        out[name + "_GBps"] = nbytes / best / GB
    del host, dev
    torch.cuda.empty_cache()
    return out
