"""Where a 16k step's time goes, per variant: one profiled step (after warm-up), the compute stream's
kernels from the trace: kernel time, idle gaps on the compute stream (sum, count > 50 us, the largest),
the step's wall time; and the same for the copy streams. Tells a GPU-side slowdown (more kernel time)
from a host-side one (more idle gaps)."""
import json, sys, tempfile, time
from pathlib import Path
import torch
from torch.profiler import ProfilerActivity, profile
sys.path.insert(0, ".")
from benchmarks.bench_selective import enable
from benchmarks.common import REFERENCE, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
variants = (sys.argv[2] if len(sys.argv) > 2 else "ckpt,hidden,selective,torch_sac").split(",")
model = build_llama(REFERENCE, "cuda", seq)
ids = torch.randint(0, REFERENCE["vocab"], (1, seq), device="cuda")


def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


for variant in variants:
    undo = enable(model, variant)
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    path = Path(tempfile.mkdtemp()) / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    streams = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e:
            streams.setdefault(e["args"].get("stream", e.get("tid")), []).append((e["ts"], e["ts"] + e["dur"], e["cat"], e.get("name", "")))
    compute = max(streams, key=lambda s: sum(1 for x in streams[s] if x[2] == "kernel"))
    rows = {}
    for s, spans in streams.items():
        spans.sort()
        busy, gaps, big, largest, end = 0.0, 0.0, 0, 0.0, None
        listed = []
        for i, (a, b, _, name) in enumerate(spans):
            if end is not None and a > end:
                gap = a - end
                listed.append((gap, (end - spans[0][0]) / 1e3, spans[i - 1][3][:50], name[:50]))
                gaps += gap
                big += gap > 50
                largest = max(largest, gap)
            busy += max(0.0, b - max(a, end or a))
            end = max(end or b, b)
        rows[s] = dict(ops=len(spans), busy_ms=round(busy / 1e3, 1), gaps_ms=round(gaps / 1e3, 1), gaps_over_50us=big,
                       largest_gap_ms=round(largest / 1e3, 2), span_ms=round((end - spans[0][0]) / 1e3, 1))
        if s == max(streams, key=lambda k: len(streams[k])):
            # The largest gaps of the compute stream: (gap ms, at ms from its first op, kernel before, kernel after).
            rows[s]["largest_gaps"] = [(round(g / 1e3, 2), round(at, 1), before, after)
                                       for g, at, before, after in sorted(listed, reverse=True)[:12]]
            # Gaps by phase: forward (before the first kernel named *backward* or *Backward*) and backward.
            first_bwd = next((a for a, _, _, n in spans if "backward" in n.lower()), None)
            rows[s]["gaps_forward_ms"] = round(sum(g for g, at, _, _ in listed if first_bwd is None or at * 1e3 + spans[0][0] < first_bwd) / 1e3, 1)
            rows[s]["gaps_backward_ms"] = round(rows[s]["gaps_ms"] - rows[s]["gaps_forward_ms"], 1)
    print(json.dumps({"variant": variant, "seq": seq, "wall_ms": round(wall * 1e3, 1), "compute_stream": compute,
                      "streams": rows}), flush=True)
    undo()
    torch.cuda.empty_cache()
