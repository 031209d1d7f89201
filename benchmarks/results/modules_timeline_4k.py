"""Issue 13 (session 20): where the 4k modules step's extra time sits on the GPU's timeline. For plain
training, modules with every save kept on the GPU (`modules_keep`, min_bytes=2**62) and modules
(`*.self_attn`), each on its own model copy, a few profiled steps (torch.profiler, CPU + CUDA); per
step: the wall time, the forward's host time (until the loss is returned), and on the GPU the
compute kernels' busy time (merged intervals, every stream but the engine's copy streams have no
kernels) and the idle time inside the step, split at the moment backward was called.

    python3 benchmarks/results/modules_timeline_4k.py [SEQ] [STEPS]
"""
import copy, os, statistics, sys
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
base = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
models = {"plain": base}
for name, options in (("modules_keep", {"min_bytes": 1 << 62}), ("modules", {})):
    models[name] = copy.deepcopy(base)
    torch_offload.apply(models[name], "modules", targets=["*.self_attn"], **options)


def merged_busy(intervals, lo, hi):
    """Total time covered by `intervals` (start, end) clipped to [lo, hi]."""
    busy, end = 0.0, lo
    for s, e in sorted(intervals):
        s, e = max(s, lo, end), min(e, hi)
        if e > s:
            busy += e - s
            end = e
    return busy


def run(name):
    model = models[name]
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with record_function("step"):
                with record_function("fwd"):
                    loss = model(input_ids=ids, labels=ids).loss
                with record_function("bwd"):
                    loss.backward()
                torch.cuda.synchronize()
            model.zero_grad(set_to_none=True)
    events = prof.events()
    # The host's ranges (the profiler also puts each range on the GPU's timeline, as an annotation).
    marks = {n: sorted((e.time_range.start, e.time_range.end) for e in events
                       if e.name == n and e.device_type == DeviceType.CPU)
             for n in ("step", "fwd", "bwd")}
    kernels = [(e.time_range.start, e.time_range.end) for e in events
               if e.device_type == DeviceType.CUDA and e.name not in ("step", "fwd", "bwd")
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    rows = []
    for (s0, s1), (f0, f1), (b0, b1) in zip(marks["step"], marks["fwd"], marks["bwd"]):
        busy_f = merged_busy(kernels, s0, b0)
        busy_b = merged_busy(kernels, b0, s1)
        rows.append(((s1 - s0) / 1e3, (f1 - f0) / 1e3, busy_f / 1e3, (b0 - s0 - busy_f) / 1e3,
                     busy_b / 1e3, (s1 - b0 - busy_b) / 1e3))
    med = [statistics.median(r[i] for r in rows) for i in range(6)]
    print(f"{name:13s} step {med[0]:6.1f}  host forward {med[1]:5.1f} | until backward: kernels {med[2]:5.1f} "
          f"idle {med[3]:5.1f} | backward: kernels {med[4]:5.1f} idle {med[5]:5.1f}  (ms, medians of {steps}, profiled)")


print(f"seq {seq}; the GPU's compute kernels (copies and memsets excluded) and its idle time, before and after "
      "the host called backward")
for name in ("plain", "modules_keep", "modules", "plain", "modules_keep", "modules"):
    run(name)
