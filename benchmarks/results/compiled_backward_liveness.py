"""Static liveness of the buffers inductor allocates in a compiled backward (issue 8, session 9).

Reads a log of TORCH_LOGS=output_code (gzip or plain), takes the LAST generated module in it (the
backward graph), walks its call() line by line (empty_strided_cuda allocations, `del`, buffer reuse)
and prints the largest total of live allocated buffers, what is live there by shape, and the CUDA
inputs the graph receives from the forward. Op outputs (e.g. attention backward's dq/dk/dv, our
restores) are not counted: their sizes are not in the code.

  python3 benchmarks/results/compiled_backward_liveness.py benchmarks/results/selective_compiled_output_code_16k_h100.log.gz \
      benchmarks/results/ckpt_compiled_output_code_16k_h100.log.gz
"""
import collections
import gzip
import re
import sys

BYTES = {"torch.bfloat16": 2, "torch.float16": 2, "torch.float32": 4, "torch.int64": 8,
         "torch.int32": 4, "torch.bool": 1, "torch.uint8": 1}
ALLOC = re.compile(r"^\s*(buf\d+) = empty_strided_cuda\((\([^)]*\)), (\([^)]*\)), (torch\.\w+)\)")
REUSE = re.compile(r"^\s*(buf\d+) = (?:reinterpret_tensor\()?(buf\d+)\b.*del (buf\d+)\s+# reuse")
DELETE = re.compile(r"\bdel ([\w, ]+)")
INPUT = re.compile(r"(\w+) = rand_strided\((\([^)]*\)), (\([^)]*\)), device='cuda:0', dtype=(torch\.\w+)\)")


def nbytes(shape: str, stride: str, dtype: str) -> int:
    sizes = [int(x) for x in re.findall(r"-?\d+", shape)]
    strides = [int(x) for x in re.findall(r"-?\d+", stride)]
    if 0 in sizes:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(sizes, strides))) * BYTES.get(dtype, 4)


def last_module(path: str) -> list:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = [re.sub(r"^.*\[__output_code\] ?", "", line.rstrip("\n")) for line in f if "[__output_code]" in line]
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("def call(self, args)")]
    return lines[starts[-1]:]


def analyse(path: str) -> None:
    code = last_module(path)
    live, shape_of, best = {}, {}, (0, 0, {})
    for number, line in enumerate(code):
        if line.strip().startswith("return ["):
            break
        if (m := ALLOC.match(line)):
            live[m[1]] = nbytes(m[2], m[3], m[4])
            shape_of[m[1]] = m[2]
        if (m := REUSE.match(line)):
            live[m[1]] = live.pop(m[2], 0)
            shape_of[m[1]] = shape_of.get(m[2], "?")
            continue
        for names in DELETE.findall(line):
            for name in names.split(","):
                live.pop(name.strip(), None)
        total = sum(live.values())
        if total > best[0]:
            best = (total, number, dict(live))
    total, number, at_max = best
    print(f"{path}\n  most allocated buffers live at once: {total / 1e9:.3f} GB (line {number} of call())")
    by_shape, count = collections.Counter(), collections.Counter()
    for name, size in at_max.items():
        by_shape[shape_of.get(name, "?")] += size
        count[shape_of.get(name, "?")] += 1
    for shape, size in by_shape.most_common(10):
        print(f"    {shape}: {count[shape]} buffers, {size / 1e6:.0f} MB")
    inputs = sorted(((nbytes(s, st, dt), n, s) for n, s, st, dt in INPUT.findall("\n".join(code))
                     if not n.startswith("primals")), reverse=True)
    print(f"  CUDA inputs from the forward (parameters aside): {sum(i[0] for i in inputs) / 1e9:.3f} GB in "
          f"{len(inputs)}; largest: " + ", ".join(f"{n} {s} {b / 1e6:.0f} MB" for b, n, s in inputs[:5]))


if __name__ == "__main__":
    for log in sys.argv[1:]:
        analyse(log)
