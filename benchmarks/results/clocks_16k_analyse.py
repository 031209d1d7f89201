"""Averages an `nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,
clocks_event_reasons.active --format=csv,noheader -lms 100` log over the windows that
clocks_16k.py printed: per variant, the median step, the mean SM clock and power, and the
clock-event reasons seen.

python3 benchmarks/results/clocks_16k_analyse.py WINDOWS.jsonl SMI.csv"""
import json
import statistics
import sys
from datetime import datetime

windows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
samples = []
for line in open(sys.argv[2]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 5:
        continue
    try:
        stamp = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((stamp, float(parts[1].split()[0]), float(parts[2].split()[0]), float(parts[3]), parts[4]))
    except ValueError:
        continue

by_variant = {}
for w in windows:
    inside = [s for s in samples if w["start"] <= s[0] <= w["end"]]
    entry = by_variant.setdefault(w["variant"], {"steps": [], "clock": [], "power": [], "temp": [], "reasons": set()})
    entry["steps"] += w["steps_s"]
    entry["clock"] += [s[1] for s in inside]
    entry["power"] += [s[2] for s in inside]
    entry["temp"] += [s[3] for s in inside]
    entry["reasons"] |= {s[4] for s in inside}
for name, e in by_variant.items():
    print(json.dumps({"variant": name, "median_step_s": statistics.median(e["steps"]),
                      "samples": len(e["clock"]),
                      "sm_clock_mhz": round(statistics.mean(e["clock"]), 1) if e["clock"] else None,
                      "power_w": round(statistics.mean(e["power"]), 1) if e["power"] else None,
                      "temp_c": round(statistics.mean(e["temp"]), 1) if e["temp"] else None,
                      "reasons": sorted(e["reasons"])}))
