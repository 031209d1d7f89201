"""What selective "attention" (keep the SDPA outputs instead of recomputing them) can be expected to
gain over checkpointing at 16k (issue 10): in checkpointing's step, the recompute's SDPA forward
kernels are the only work the policy removes (its backward still recomputes every other op), so the
step shrinks by about their time (single steps scatter by 1-2% around that). Read from one
checkpointing step's GPU timeline (step_trace.py, session 13): span / (span - recompute SDPA time).

python3 benchmarks/results/selective_ceiling_16k.py [TRACE]"""
import gzip
import json
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/traces_session13/trace_ckpt_16384.json.gz"
events = json.load(gzip.open(path))["traceEvents"]
kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"), key=lambda e: e["ts"])
first_backward = min(e["ts"] for e in kernels if "bprop" in e["name"])
span_ms = (max(e["ts"] + e["dur"] for e in kernels) - kernels[0]["ts"]) / 1e3
fprop = [e for e in kernels if "sdpa" in e["name"] and "fprop" in e["name"]]
forward_ms = sum(e["dur"] for e in fprop if e["ts"] < first_backward) / 1e3
recompute_ms = sum(e["dur"] for e in fprop if e["ts"] >= first_backward) / 1e3
print(json.dumps({"trace": path, "step_span_ms": round(span_ms, 1), "sdpa_fprop_kernels": len(fprop),
                  "sdpa_fprop_forward_ms": round(forward_ms, 1), "sdpa_fprop_recompute_ms": round(recompute_ms, 1),
                  "ceiling_vs_ckpt": round(span_ms / (span_ms - recompute_ms), 4)}))
