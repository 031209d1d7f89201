"""Issue 13 (session 20): does device-to-host DMA traffic by itself slow the host thread that drives a
4k training step? Plain training (no offloading) step by step, each step alone or with GB of copies
queued on a side stream at its start (64 MB chunks from one device buffer into distinct pinned
buffers, as the engine's pool holds them; the link carries them during the forward), beside mode
"modules" (`*.self_attn`, which copies about 1.6 GB a step at 4k) on its own model copy.

    python3 benchmarks/results/dma_host_effect.py [SEQ] [SETS] [GB] [VARIANTS]

VARIANTS (comma-separated): plain, d2h (plain + GB device-to-host at the step's start), h2d (the same
host-to-device), modules; any of d2h / h2d + "_l0": the copies queued when the first decoder layer
starts (a forward pre-hook), after the model's one synchronizing call (transformers' mask code
reads a value: at the step's start that read waits behind the copies on the copy engine);
d2h_small_l0: the same bytes into one 8 MB pinned buffer again and again (a destination that stays
in the host's last-level cache). Per variant: the median step and forward (until the loss is returned), and
the variant's / plain's, medians over the sets (the order rotates every set).
"""
import copy, os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
sets = int(sys.argv[2]) if len(sys.argv) > 2 else 40
gb = float(sys.argv[3]) if len(sys.argv) > 3 else 1.6
variants = (sys.argv[4] if len(sys.argv) > 4 else "plain,d2h,h2d,modules").split(",")
base = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
models = {"plain": base}
if "modules" in variants:
    models["modules"] = copy.deepcopy(base)
    handle = torch_offload.apply(models["modules"], "modules", targets=["*.self_attn"])
chunk = 64 << 20
device_buffer = torch.empty(chunk, dtype=torch.uint8, device="cuda")
host_buffers = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(int(gb * 1e9 / chunk))]
small_host = torch.empty(8 << 20, dtype=torch.uint8, pin_memory=True)
side = torch.cuda.Stream()


def queue_copies(kind):
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        if kind == "d2h_small":
            for _ in range(len(host_buffers) * (chunk // small_host.numel())):
                small_host.copy_(device_buffer[:small_host.numel()], non_blocking=True)
            return
        for host in host_buffers:
            if kind == "d2h":
                host.copy_(device_buffer, non_blocking=True)
            else:
                device_buffer.copy_(host, non_blocking=True)


current = [None]  # the running variant, for the first layer's pre-hook


def at_first_layer(module, args):
    if current[0] is not None and current[0].endswith("_l0"):
        queue_copies(current[0][:-len("_l0")])


base.model.layers[0].register_forward_pre_hook(at_first_layer)


def step(v):
    model = models.get(v, base)
    model.zero_grad(set_to_none=True)
    current[0] = v
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if v in ("d2h", "h2d"):
        queue_copies(v)
    loss = model(input_ids=ids, labels=ids).loss
    t1 = time.perf_counter()
    loss.backward()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    return (t2 - t0) * 1e3, (t1 - t0) * 1e3


for i in range(3 * len(variants)):
    step(variants[i % len(variants)])
steps = {v: [] for v in variants}
forwards = {v: [] for v in variants}
for i in range(sets):
    shift = i % len(variants)
    for v in variants[shift:] + variants[:shift]:
        s, f = step(v)
        steps[v].append(s)
        forwards[v].append(f)
print(f"seq {seq}, {sets} sets, {len(host_buffers)} x 64 MB = {len(host_buffers) * chunk / 1e9:.2f} GB per step "
      f"in d2h / h2d; medians in ms")
for v in variants:
    ratio = statistics.median(s / p for s, p in zip(steps[v], steps["plain"]))
    fratio = statistics.median(f / p for f, p in zip(forwards[v], forwards["plain"]))
    print(f"{v:8s} step {statistics.median(steps[v]):7.1f} (p10 {statistics.quantiles(steps[v], n=10)[0]:.1f}, "
          f"p90 {statistics.quantiles(steps[v], n=10)[-1]:.1f})  forward {statistics.median(forwards[v]):6.1f}  "
          f"step / plain {ratio:.4f}x  forward / plain {fratio:.4f}x")
