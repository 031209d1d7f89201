"""Where hidden_states loses ~1.2% to torch's checkpoint at 16k (issue 10). Interleaved rounds of
variants that each take away one difference, then one profiled step per variant: kernel time summed
by kernel name (the largest differences against checkpointing) and the CUDA runtime calls per step
(syncs, stream waits, allocations).

  ckpt              HF gradient_checkpointing_enable, non-reentrant (the baseline)
  torch_wrapped     torch's checkpoint around each layer's forward, the way our handle wraps it
  hidden            apply(mode="hidden_states")
  hidden_nocopy     the same, every save kept on the GPU (keep_on_device_bytes=1e12): no copies
  hidden_unbounded  the same with max_in_flight=0 (the host never waits for copies)
  ckpt_re, hidden_re   the reentrant variants

python3 benchmarks/results/hidden_overhead_16k.py [SEQ] [ROUNDS]"""
import json
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from benchmarks.common import REFERENCE, build_llama, timed_steps  # noqa: E402

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
model = build_llama(REFERENCE, "cuda", seq)
ids = torch.randint(0, REFERENCE["vocab"], (1, seq), device="cuda")


def hf_ckpt(reentrant):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return model.gradient_checkpointing_disable


def torch_wrapped():
    originals = []
    for layer in model.model.layers:
        forward = layer.forward
        originals.append((layer, forward))
        layer.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)

    def undo():
        for layer, _ in originals:
            del layer.forward
    return undo


VARIANTS = {
    "ckpt": lambda: hf_ckpt(False),
    "torch_wrapped": torch_wrapped,
    "hidden": lambda: torch_offload.apply(model, mode="hidden_states").remove,
    "hidden_nocopy": lambda: torch_offload.apply(model, mode="hidden_states", keep_on_device_bytes=int(1e12)).remove,
    "hidden_unbounded": lambda: torch_offload.apply(model, mode="hidden_states", max_in_flight=0).remove,
    "ckpt_re": lambda: hf_ckpt(True),
    "hidden_re": lambda: torch_offload.apply(model, mode="hidden_states", use_reentrant=True).remove,
}


def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


def timed(n):
    return timed_steps(step, n, seq, "cuda")["times_s"]


times = {v: [] for v in VARIANTS}
peaks = {}
for r in range(rounds):
    for name, enable in VARIANTS.items():
        undo = enable()
        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times[name] += timed(3)
        peaks[name] = torch.cuda.max_memory_allocated() / 1e9
        undo()
    print(json.dumps({"round": r, **{v: round(statistics.median(t[-3:]), 4) for v, t in times.items()}}), flush=True)

base = statistics.median(times["ckpt"])
summary = {v: {"median_s": round(statistics.median(t), 4), "vs_ckpt": round(base / statistics.median(t), 4),
               "peak_GB": round(peaks[v], 2)} for v, t in times.items()}
print(json.dumps({"seq": seq, "rounds": rounds, "summary": summary}), flush=True)

RUNTIME = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaStreamWaitEvent",
           "cudaEventRecord", "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaMemcpyAsync", "cudaLaunchKernel",
           "cudaEventQuery", "cudaStreamIsCapturing")
kernels = {}
for name, enable in VARIANTS.items():
    undo = enable()
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = timed(1)[0]
    undo()
    per_kernel, calls = {}, {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA or (e.self_device_time_total > 0 and e.cpu_time_total == 0):
            per_kernel[e.key[:90]] = per_kernel.get(e.key[:90], 0.0) + e.self_device_time_total / 1e3
        for api in RUNTIME:
            if e.key.startswith(api):
                calls[api] = (e.count, round(e.cpu_time_total / 1e3, 2))
    kernels[name] = per_kernel
    print(json.dumps({"variant": name, "wall_ms": round(wall * 1e3, 1),
                      "kernel_ms": round(sum(per_kernel.values()), 1), "runtime_calls": calls}), flush=True)

for name in VARIANTS:
    if name == "ckpt":
        continue
    diff = {k: kernels[name].get(k, 0.0) - kernels["ckpt"].get(k, 0.0)
            for k in set(kernels[name]) | set(kernels["ckpt"])}
    top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:10]
    print(json.dumps({"variant": name, "kernel_ms_minus_ckpt": [(k, round(v, 2)) for k, v in top]}), flush=True)
