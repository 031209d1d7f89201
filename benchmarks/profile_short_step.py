"""Where the time of a short step goes (GPU): per variant, the median step time over 7 steps, then one
profiled step: kernel time per CUDA stream, copy time, CUDA runtime calls, the top CPU ops by self
time; writes profile_SEQ.json and one Chrome trace per variant to --out.

    python3 benchmarks/profile_short_step.py --out DIR --seq 4096

At 4k the reference model's step is bound by the host (kernels busy 121 of 172 ms under torch's
checkpointing), so what each variant adds on the host thread is what it costs.
"""
import argparse, collections, json, statistics, sys, time, os
from pathlib import Path
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import build_llama, release_memory

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--seq", type=int, default=4096)
p.add_argument("--variants", default="none,ckpt,hidden_states,selective,selective_per_op,modules")
args = p.parse_args()
REF = dict(layers=24, hidden=2048, intermediate=5632, heads=16, kv_heads=8, vocab=32000)
model = build_llama(REF, "cuda", args.seq)
ids = torch.randint(0, 32000, (1, args.seq), device="cuda")
out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
results = {}

def enable(v):
    if v == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model.gradient_checkpointing_disable
    if v == "none":
        return lambda: None
    if v == "selective_per_op":
        return torch_offload.apply(model, "selective", policy=torch_offload.policies.attention).remove
    if v == "modules":
        return torch_offload.apply(model, "modules", targets=["*.self_attn"]).remove
    if v.endswith("_re"):  # the reentrant variant of a mode (hidden_states_re, selective_re)
        return torch_offload.apply(model, v[:-3], use_reentrant=True).remove
    return torch_offload.apply(model, v).remove

def step():
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()

for v in args.variants.split(","):
    undo = enable(v)
    try:
        for _ in range(2):
            step()
        times = []
        for _ in range(7):
            torch.cuda.synchronize(); t = time.perf_counter(); step(); torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter(); step(); torch.cuda.synchronize(); wall = time.perf_counter() - t
        trace = out / f"trace_{v}.json"
        prof.export_chrome_trace(str(trace))
        ev = json.load(open(trace))["traceEvents"]
        busy = collections.Counter(); copies = collections.Counter(); rt = collections.defaultdict(lambda: [0, 0.0])
        span = [1e30, 0]
        for e in ev:
            cat = e.get("cat", ""); d = e.get("dur", 0)
            if cat == "kernel":
                busy[e["args"].get("stream")] += d
                span[0] = min(span[0], e["ts"]); span[1] = max(span[1], e["ts"] + d)
            elif cat == "gpu_memcpy":
                copies[(e["args"].get("stream"), e["name"][:40])] += d
            elif cat == "cuda_runtime":
                rt[e["name"]][0] += 1; rt[e["name"]][1] += d
        top_rt = sorted(rt.items(), key=lambda kv: -kv[1][1])[:8]
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60)
        r = {"median_step_s": statistics.median(times), "times": times, "profiled_wall_s": wall,
             "kernel_busy_ms_per_stream": {str(k): v / 1e3 for k, v in busy.items()},
             "kernel_span_ms": (span[1] - span[0]) / 1e3,
             "copies_ms": {f"{k[0]}:{k[1]}": v / 1e3 for k, v in copies.items()},
             "runtime_top": {k: {"count": c, "ms": d / 1e3} for k, (c, d) in top_rt},
             "peak_GB": torch.cuda.max_memory_allocated() / 2**30}
        results[v] = r
        print(f"=== {v}: median {r['median_step_s']*1e3:.1f} ms, profiled {wall*1e3:.1f} ms, kernel span {r['kernel_span_ms']:.1f} ms")
        print("  kernel busy per stream ms:", {k: round(x, 1) for k, x in r["kernel_busy_ms_per_stream"].items()})
        print("  copies ms:", {k: round(x, 1) for k, x in r["copies_ms"].items()})
        print("  runtime top:", {k: (x["count"], round(x["ms"], 1)) for k, x in r["runtime_top"].items()})
        print(table)
        sys.stdout.flush()
    finally:
        undo()
        release_memory("cuda")
base = results.get("ckpt", {}).get("median_step_s")
for v, r in results.items():
    print(f"{v:18s} {r['median_step_s']*1e3:8.1f} ms  x ckpt {base / r['median_step_s'] if base else float('nan'):.3f}")
json.dump(results, open(out / f"profile_{args.seq}.json", "w"), indent=1)
