"""Differences of two py-spy raw profiles (--native --format raw) of a training loop's forward: per
frame, samples per step (inclusive) in the first and the second, largest growth first. Frames
without a symbol are grouped by library. Samples of the autograd engine's threads are left out.

    python3 benchmarks/results/pyspy_diff.py A.txt.gz STEPS_A B.txt.gz STEPS_B
(STEPS: the steps the loop ran while py-spy sampled: its duration / the loop's step time.)
"""
import collections, gzip, sys


def load(path, steps):
    inclusive = collections.Counter()
    total = 0
    for line in gzip.open(path, "rt"):
        stack, _, n = line.rstrip().rpartition(" ")
        n = int(n)
        if "LlamaForCausalLM.forward" not in stack or "thread_main" in stack:
            continue
        total += n
        seen = set()
        for frame in stack.split(";"):
            name = frame.split(" (")[0][:70]
            if name.startswith("0x"):
                name = "<" + frame.split(" (")[-1].rstrip(")") + ">"
            if name not in seen:
                seen.add(name)
                inclusive[name] += n
    return {k: v / steps for k, v in inclusive.items()}, total / steps


a, total_a = load(sys.argv[1], float(sys.argv[2]))
b, total_b = load(sys.argv[3], float(sys.argv[4]))
print(f"forward samples per step: {total_a:.1f} vs {total_b:.1f}")
for d, k in sorted(((b.get(k, 0) - a.get(k, 0), k) for k in set(a) | set(b)), reverse=True)[:60]:
    print(f"{d:+7.2f}  {a.get(k, 0):7.2f} -> {b.get(k, 0):7.2f}  {k}")
