"""The GPU timeline of one training step of the reference model, profiled with CUDA activity only
(recording CPU ops made the host the bottleneck): where the compute stream sits idle in forward, in
the loss and head's backward and in the layers' backward (recompute included), the largest gaps
and the kernels around each one, and how busy the copy streams are. Writes each Chrome trace
(gzipped) to OUTDIR and prints one JSON summary per variant.

  none            plain training
  modules         apply(mode="modules", targets=["*.self_attn"]) (issue 13)
  modules_nocopy  the same with every save kept on the GPU (keep_on_device_bytes=1e12)
  ckpt            Hugging Face gradient checkpointing, non-reentrant (issue 10)
  hidden          apply(mode="hidden_states")
  hidden_nocopy   the same with every save kept on the GPU

python3 benchmarks/results/step_trace.py OUTDIR [SEQ] [VARIANT,...]"""
import gzip
import json
import os
import sys
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from benchmarks.common import REFERENCE, TINY, build_llama  # noqa: E402

warnings.simplefilter("ignore", torch_offload.NothingOffloadedWarning)
out = sys.argv[1]
seq = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
os.makedirs(out, exist_ok=True)
shape, device = (REFERENCE, "cuda") if torch.cuda.is_available() else (TINY, "cpu")  # cpu: a smoke run
model = build_llama(shape, device, seq)
ids = torch.randint(0, shape["vocab"], (1, seq), device=device)


def modules(**options):
    return torch_offload.apply(model, "modules", targets=["*.self_attn"], **options)


def hf_checkpointing():
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.gradient_checkpointing_disable


def hidden(**options):
    return torch_offload.apply(model, "hidden_states", **options).remove


VARIANTS = {"none": lambda: None, "modules": lambda: modules().remove,
            "modules_nocopy": lambda: modules(keep_on_device_bytes=int(1e12)).remove,
            "ckpt": hf_checkpointing, "hidden": hidden,
            "hidden_nocopy": lambda: hidden(keep_on_device_bytes=int(1e12))}
chosen = sys.argv[3].split(",") if len(sys.argv) > 3 else ["none", "modules_nocopy", "modules"]


def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


def intervals(events):
    return sorted((e["ts"], e["ts"] + e.get("dur", 0), e.get("name", "")) for e in events)


def busy(spans, start, end):
    total, cursor = 0.0, start
    for s, e, _ in spans:
        s, e = max(s, cursor), min(e, end)
        if e > s:
            total += e - s
            cursor = e
    return total


def gaps(spans, start, end, top=8):
    found, cursor, before = [], start, "(phase start)"
    for s, e, name in spans:
        if e <= start or s >= end:
            continue
        if s - cursor > 20:
            found.append((round((s - cursor) / 1e3, 3), before[:50], name[:50]))
        if e > cursor:
            cursor, before = e, name
    total = sum(g[0] for g in found)
    return round(total, 2), sorted(found, reverse=True)[:top]


def analyse(trace):
    """Phases from the compute stream's kernels: forward up to the loss's backward kernel, backward
    from there to the last kernel (the step is profiled alone)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not kernels:  # a CPU run
        return {}
    compute_stream = max({e["args"].get("stream") for e in kernels},
                         key=lambda s: sum(1 for e in kernels if e["args"].get("stream") == s))
    compute = intervals([e for e in kernels if e["args"].get("stream") == compute_stream])
    loss_backward = min(e["ts"] for e in kernels if "nll_loss_backward" in e["name"])
    first_layer_backward = min(e["ts"] for e in kernels if "silu_backward" in e["name"])
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    d2h = intervals([e for e in copies if "DtoH" in e["name"]])
    h2d = intervals([e for e in copies if "HtoD" in e["name"]])
    phases = {"forward": (compute[0][0], loss_backward), "loss_and_head_backward": (loss_backward, first_layer_backward),
              "layers_backward": (first_layer_backward, compute[-1][1])}
    summary = {"step_gpu_ms": round((compute[-1][1] - compute[0][0]) / 1e3, 2)}
    for phase, (start, end) in phases.items():
        total_gap, largest = gaps(compute, start, end, top=4)
        summary[phase] = {"ms": round((end - start) / 1e3, 2),
                          "compute_busy_ms": round(busy(compute, start, end) / 1e3, 2),
                          "compute_gaps_ms": total_gap, "largest_gaps": largest,
                          "d2h_busy_ms": round(busy(d2h, start, end) / 1e3, 2),
                          "h2d_busy_ms": round(busy(h2d, start, end) / 1e3, 2)}
    if d2h:
        summary["last_d2h_end_after_forward_ms"] = round((d2h[-1][1] - loss_backward) / 1e3, 2)
    return summary


for name in chosen:
    undo = VARIANTS[name]()
    for _ in range(3):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:  # no CPU ops on CUDA: little host overhead
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    path = os.path.join(out, f"trace_{name}_{seq}.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    with gzip.open(path + ".gz", "wt") as f:
        json.dump(trace, f)
    os.remove(path)
    print(json.dumps({"variant": name, **analyse(trace)}), flush=True)
    if undo is not None:
        undo()
