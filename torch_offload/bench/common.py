"""What every benchmark shares (the benchmarks/ scripts and `python -m torch_offload.bench`): model
shapes, the random-init Llama builder, synced step timing, pinned-memory bandwidth, the results
header and the markdown run table."""
import datetime
import gc
import os
import re
import shlex
import statistics
import sys
import time

import torch

GB = 1e9
# The reference model (1.26B, docs/performance.md) and the Llama-3-8B shape; TINY for CPU smoke runs.
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


def host_cpu() -> str:
    """The host's CPU model and logical CPU count: what bounds the host-side figures (the disk
    tier's checksums and page-cache copies)."""
    name = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical CPUs"


def short_gpu_name(device) -> str:
    """"h100" for "NVIDIA H100 80GB HBM3": the suffix of result file names."""
    return "cpu" if device == "cpu" else gpu_name(device).split()[1].split("-")[0].lower()


def llama_config(shape: dict, max_positions: int, attn_implementation: str = "sdpa"):
    """The LlamaConfig of `shape` (no KV cache)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                       intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
                       num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                       max_position_embeddings=max_positions, attn_implementation=attn_implementation,
                       use_cache=False)


def build_llama(shape: dict, device: str, max_positions: int, dtype=None, attn_implementation: str = "sdpa"):
    """A random-init LlamaForCausalLM (no KV cache) in training mode, built on `device` in `dtype`
    (default bf16 on CUDA, so an 8B model never exists in fp32, fp32 elsewhere). On "meta" it has
    no values (a model to shard, then materialise), and the random state is left alone."""
    from transformers import LlamaForCausalLM

    config = llama_config(shape, max_positions, attn_implementation)
    if dtype is None:
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if device != "meta":
        torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.train()


def new_result(args, **extra) -> dict:
    """The header every results JSON starts with: the command, when, torch, model shape, device and
    host CPU."""
    return {"command": " ".join(shlex.quote(a) for a in sys.argv), "date": datetime.datetime.now().isoformat(),
            "torch": torch.__version__, "config": args.config, "gpu": gpu_name(args.device),
            "host_cpu": host_cpu(), "runs": [], **extra}


def release_memory(device) -> None:
    """Between runs: collect garbage, return cached device and pinned host memory."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch._C._host_emptyCache()


def timed_steps(step, steps: int, seq: int, device) -> dict:
    """Runs `step` `steps` times, each between device syncs: median and every step time, tokens/s
    and, on CUDA, peak allocated / reserved memory since the caller last reset the peaks."""
    times = []
    for _ in range(steps):
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - start)
    row = {"step_s": statistics.median(times), "times_s": times}
    row["tokens_per_s"] = seq / row["step_s"]
    if device == "cuda":
        row["peak_allocated_GB"] = torch.cuda.max_memory_allocated() / GB
        row["peak_reserved_GB"] = torch.cuda.max_memory_reserved() / GB
    return row


RATIOS = ("x_checkpointing",)  # the ratio columns: shown only where both rows were measured


def moved_nothing_cell(reason: str) -> str:
    """A table cell for a run that moved nothing, from the reason NothingOffloadedWarning gave:
    "N saved tensors were under min_bytes=M (...); ..." reads "min_bytes=M above every saved
    activation" (the rest were parameters or buffers, never offloaded); another reason, its first
    clause."""
    small = re.match(r"\d+ saved tensors were under min_bytes=(\d+)", reason)
    return "moved nothing: " + (f"min_bytes={small.group(1)} above every saved activation" if small
                                else reason.split("; ")[0])


def table(runs, columns) -> list:
    """Markdown table lines for benchmark runs: seq, variant, then `columns` as (title, key, format);
    a missing value shows "-", a failed run its error, and a ratio column of a run that offloaded
    nothing ("moved_nothing": why) says so instead of a number."""
    lines = ["| seq | variant | " + " | ".join(title for title, _, _ in columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    for r in runs:
        if "error" in r:
            cells = [r["error"]] + [""] * (len(columns) - 1)
        else:
            cells = [fmt.format(r[key]) if r.get(key) is not None else "-" for _, key, fmt in columns]
            if r.get("moved_nothing"):
                cells = [moved_nothing_cell(r["moved_nothing"]) if key in RATIOS else cell
                         for (_, key, _), cell in zip(columns, cells)]
        lines.append(f"| {r['seq']} | {r['variant']} | " + " | ".join(cells) + " |")
    return lines


def pinned_bandwidth(nbytes: int = 1 << 30, repeats: int = 3) -> dict:
    """Best-of-`repeats` pinned host<->device copy bandwidth in GB/s: {"bytes", "d2h_GBps",
    "h2d_GBps"}."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = {"bytes": nbytes}
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
    release_memory("cuda")
    return out


def add_link_utilisation(row: dict, bandwidth: dict) -> None:
    """Link utilisation of a run of ours per direction: bytes copied / (step time x the link's
    measured bandwidth, `bandwidth` as pinned_bandwidth() returns it)."""
    for direction, moved in (("d2h", row.get("to_host_MB")), ("h2d", row.get("to_device_MB"))):
        if moved is not None and row.get("step_s"):
            seconds_needed = moved * 2**20 / (bandwidth[direction + "_GBps"] * GB)
            row[direction + "_link_use"] = seconds_needed / row["step_s"]


def add_ratios(rows: list) -> None:
    """x_checkpointing: tokens/s over the checkpointing run's at the same sequence length, only where
    both were measured; not for a run of an offloading mode that moved nothing ("moved_nothing"),
    whose speed is no result of offloading."""
    baseline = {r["seq"]: r["tokens_per_s"] for r in rows
                if r["variant"] == "checkpointing" and "tokens_per_s" in r}
    for r in rows:
        if r["seq"] in baseline and "tokens_per_s" in r and not r.get("moved_nothing"):
            r["x_checkpointing"] = r["tokens_per_s"] / baseline[r["seq"]]
