"""Issue 13 (session 20): the host time of one save through the engine on the GPU machine, without a
model: offload_pack_filtered on N distinct op outputs of 16 MB (4k x 2048 bf16, as a 4k attention's
saves), kept by the filter, offloaded one copy at a time, and offloaded in batches of 5 (modules'
copies per selected call; offload_batch begin / end around each 5, the end's issue timed apart);
then the same through torch's saved-tensor hooks (torch.mul saving its inputs under
torch_offload.offload_activations' C hooks) against the same muls without hooks.

    python3 benchmarks/results/pack_cost_cuda.py [N] [REPEATS]   (PACK_COST_DEVICE=cpu: a smoke run here)
"""
import statistics, sys, time
import torch
import torch_offload
import os
DEVICE = os.environ.get("PACK_COST_DEVICE", "cuda")
from torch_offload._ops import offload_batch, offload_pack_filtered


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()

n = int(sys.argv[1]) if len(sys.argv) > 1 else 120
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 10
leaf = torch.randn(4096, 2048, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
sources = [leaf * 1 for _ in range(n)]  # op outputs (grad_fn set), as activations are
manager = torch_offload.OffloadManager(max_in_flight=0)
mid = manager.id()
keep_filter = manager.add_save_filter(1 << 62, False)
offload_filter = manager.add_save_filter(1 << 20, False)


def timed_packs(filter_id, batch):
    per_pack, per_end = [], []
    for r in range(repeats + 1):
        sync()
        handles = []
        packs, ends = [], []
        for i, x in enumerate(sources):
            if batch and i % batch == 0:
                offload_batch(mid, True)
            t0 = time.perf_counter_ns()
            handles.append(offload_pack_filtered(x, mid, filter_id, False))
            packs.append(time.perf_counter_ns() - t0)
            if batch and i % batch == batch - 1:
                t0 = time.perf_counter_ns()
                offload_batch(mid, False)
                ends.append(time.perf_counter_ns() - t0)
        manager.synchronize()
        del handles
        if r:
            per_pack.append(statistics.median(packs) / 1e3)
            if ends:
                per_end.append(statistics.median(ends) / 1e3)
    return statistics.median(per_pack), (statistics.median(per_end) if per_end else 0.0)


for name, filter_id, batch in (("kept", keep_filter, 0), ("offload, one by one", offload_filter, 0),
                               ("offload, batches of 5", offload_filter, 5), ("kept", keep_filter, 0)):
    pack_us, end_us = timed_packs(filter_id, batch)
    print(f"op only   {name:24s} {pack_us:6.1f} us per pack" + (f", {end_us:6.1f} us per batch's end" if batch else ""))

# Through torch's saved-tensor hooks: y = x * w saves x and w; w is a weight (kept), x an activation.
w = torch.randn(4096, 2048, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
for name, min_bytes in (("no hooks", None), ("hooks, all kept", 1 << 62), ("hooks, offloaded", 1 << 20),
                        ("no hooks", None)):
    times = []
    for r in range(repeats + 1):
        sync()
        outs = []
        t0 = time.perf_counter_ns()
        if min_bytes is None:
            for x in sources:
                outs.append(x * w)
        else:
            with torch_offload.offload_activations(manager=manager, min_bytes=min_bytes):
                for x in sources:
                    outs.append(x * w)
        elapsed = (time.perf_counter_ns() - t0) / 1e3 / n
        manager.synchronize()
        del outs
        if r:
            times.append(elapsed)
    print(f"mul + save {name:23s} {statistics.median(times):6.1f} us per mul (2 saves: the activation and the weight)")
