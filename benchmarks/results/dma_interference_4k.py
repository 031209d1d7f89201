"""Issue 13 (session 17): does copy traffic alone slow the 4k step, whose forward is bound by the
host? Plain training (no offload, no hooks) step by step, alternating: alone; with device-to-host
copies of the modules mode's volume (MB per step, default 1612: what `*.self_attn` offloads at 4k)
queued on a side stream when the first decoder layer starts (after the model's own synchronising
checks at the start of forward: HF's packed-sequence test reads a value back), so that they run
during the forward; and with the same volume host-to-device. The copies touch nothing of the model; only the link and the host's
memory see them. Per variant: the host's forward time, the step; paired differences.

    python3 benchmarks/results/dma_interference_4k.py [SEQ] [SETS] [MB] [layer0|start]

With "start" the copies are queued before the forward instead (call 8's run): HF's check at the start
of forward then waits for all of them, since its read-back queues behind them on the copy engine.
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
sets = int(sys.argv[2]) if len(sys.argv) > 2 else 40
total_mb = int(sys.argv[3]) if len(sys.argv) > 3 else 1612
where = sys.argv[4] if len(sys.argv) > 4 else "layer0"
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
CHUNK = 64 << 20  # bytes per copy, like a 4k attention save (16 MB) x 4
chunks = max(1, (total_mb << 20) // CHUNK)
device_buffer = torch.empty(CHUNK, dtype=torch.uint8, device="cuda")
host_buffers = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(chunks)]
side = torch.cuda.Stream()


def queue_copies(direction):
    with torch.cuda.stream(side):
        for host in host_buffers:
            if direction == "d2h":
                host.copy_(device_buffer, non_blocking=True)
            else:
                device_buffer.copy_(host, non_blocking=True)


direction = {"now": None}
model.model.layers[0].register_forward_pre_hook(
    lambda module, args: queue_copies(direction["now"]) if direction["now"] else None)


def step(variant):
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    direction["now"] = None if variant == "plain" or where == "start" else variant
    if variant != "plain" and where == "start":
        queue_copies(variant)
    loss = model(input_ids=ids, labels=ids).loss
    t1 = time.perf_counter()
    loss.backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, (t1 - t0) * 1e3


VARIANTS = ["plain", "d2h", "h2d"]
rows = {v: {"step": [], "forward": []} for v in VARIANTS}
for i in range(2 * len(VARIANTS)):
    step(VARIANTS[i % len(VARIANTS)])
t = time.perf_counter()
queue_copies("d2h")
torch.cuda.synchronize()
d2h_ms = (time.perf_counter() - t) * 1e3
for i in range(sets):
    shift = i % len(VARIANTS)
    for v in VARIANTS[shift:] + VARIANTS[:shift]:
        for key, value in zip(("step", "forward"), step(v)):
            rows[v][key].append(value)
print(f"seq {seq}, {sets} sets; copies: {chunks} x {CHUNK >> 20} MB per step ({d2h_ms:.1f} ms device-to-host alone)")
for v, row in rows.items():
    print(f"{v:6s} step {statistics.median(row['step']):6.1f}  host forward {statistics.median(row['forward']):5.1f}")
for v in VARIANTS[1:]:
    for key in ("step", "forward"):
        diffs = [x - y for x, y in zip(rows[v][key], rows["plain"][key])]
        print(f"{v} - plain, {key}: median {statistics.median(diffs):+.2f} ms, mean {statistics.mean(diffs):+.2f} ms")
