"""Session 20: two py-spy raw profiles (--native --format raw, no --threads) of modules_loop_4k.py, compared by
the share of the forward's main-thread samples in each frame (inclusive), largest growth first.

    python3 benchmarks/results/pyspy_compare_forward.py A.txt.gz B.txt.gz
"""
import collections, gzip, sys
def load(path):
    frames = collections.Counter(); total = 0; fwd = 0; bwd = 0; other = 0
    for line in gzip.open(path, "rt"):
        stack, _, n = line.rstrip().rpartition(" "); n = int(n)
        total += n
        if "step (benchmarks/results/modules_loop_4k.py" not in stack and "step (modules_loop_4k.py" not in stack:
            other += n; continue
        if "modeling_llama.py:467" not in stack:
            bwd += n; continue
        fwd += n
        seen = set()
        for fr in stack.split(";"):
            name = fr.split(" (")[0][:90]
            if name.startswith("0x"): name = "<" + fr.split(" (")[-1].rstrip(")") + ">"
            if name not in seen:
                seen.add(name); frames[name] += n
    return total, fwd, bwd, other, frames
a = load(sys.argv[1]); b = load(sys.argv[2])
print("total/fwd/main-not-fwd/other threads", a[:4], b[:4])
fa, fb = a[4], b[4]
keys = set(fa) | set(fb)
rows = sorted(keys, key=lambda k: -(fb[k]/b[1] - fa[k]/a[1]))
for k in rows[:45]:
    print(f"{fa[k]/a[1]*100:6.1f}% -> {fb[k]/b[1]*100:6.1f}%  {k}")
