"""Per thread of a Chrome trace: wall span and summed time of top-level CPU ops and CUDA runtime calls."""
import json, sys, collections
for path in sys.argv[1:]:
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    by = collections.defaultdict(list)
    for e in ev:
        if e.get("cat") in ("cpu_op", "cuda_runtime", "user_annotation", "python_function"):
            by[e["tid"]].append(e)
    print("==", path)
    for tid, es in sorted(by.items(), key=lambda kv: -len(kv[1]))[:4]:
        es.sort(key=lambda e: e["ts"])
        top, end = 0.0, -1
        for e in es:  # union of intervals of cpu ops (top-level time)
            if e.get("cat") != "cpu_op":
                continue
            s, d = e["ts"], e["dur"]
            if s >= end:
                top += d; end = s + d
            elif s + d > end:
                top += s + d - end; end = s + d
        rt = sum(e["dur"] for e in es if e.get("cat") == "cuda_runtime")
        span = (es[-1]["ts"] + es[-1]["dur"] - es[0]["ts"]) / 1e3
        names = collections.Counter(e["name"] for e in es if e.get("cat") == "cuda_runtime")
        print(f"  tid {tid}: span {span:.1f} ms, cpu ops (union) {top/1e3:.1f} ms, cuda runtime {rt/1e3:.1f} ms, events {len(es)}, runtime calls {dict(names.most_common(6))}")
