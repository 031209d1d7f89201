"""Session 23: the 4k modules step ratio against the host's speed, over every run of
modules_host_split_4k.py kept here (sessions 21-23, H100 and H200): for each process, plain
training's forward host time (ms, median) and `modules`' step / plain median in that process
(`modules` is the library of that session and call; the A/Bs of sessions 21-23 put the variants
within the spread of one another).
Printed sorted by host time, with the median ratio per host-time band and the correlation.

    python3 benchmarks/results/modules_ratio_vs_host.py
"""
import glob, os, re, statistics

here = os.path.dirname(os.path.abspath(__file__))
points = []
for path in sorted(glob.glob(os.path.join(here, "modules_host_split_*4k_session2[123]_h*.log"))):
    if "head_start" in path:
        continue  # its host times include a GPU sleep (and its step is the GPU's alone)
    gpu = "H200" if "h200" in os.path.basename(path) else "H100"
    fwd_host = None
    for line in open(path):
        fields = line.split()
        if fields[:1] == ["plain"] and len(fields) >= 3:
            fwd_host = float(fields[2])
        match = re.match(r"modules: step / plain median ([0-9.]+)x", line)
        if match and fwd_host is not None:
            points.append((fwd_host, float(match.group(1)), gpu, os.path.basename(path)))
            fwd_host = None
points.sort()
print(f"{'plain fwd host ms':>18s} {'modules / plain':>16s}  gpu   log")
for fwd_host, ratio, gpu, name in points:
    print(f"{fwd_host:18.2f} {ratio:15.4f}x  {gpu}  {name}")
print()
for low, high in ((0, 28), (28, 35), (35, 100)):
    band = [r for h, r, _, _ in points if low <= h < high]
    if band:
        print(f"plain forward host {low}-{high} ms: {len(band)} processes, modules / plain median "
              f"{statistics.median(band):.4f}x (range {min(band):.4f}-{max(band):.4f}x), "
              f"at or under 1.10x: {sum(r <= 1.10 for r in band)}")
xs, ys = [p[0] for p in points], [p[1] for p in points]
print(f"correlation of ratio with plain forward host time: {statistics.correlation(xs, ys):.2f} "
      f"over {len(points)} processes")
