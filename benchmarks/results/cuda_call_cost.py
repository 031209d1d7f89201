"""Host time per call of what a copying save does, with the GPU kept busy (so every call only
enqueues), to size a copy launcher off the forward thread (issue 13): an event record on the compute
stream, a side stream's wait on it, torch's own copy of 16 MB to pinned memory on a side stream, the
engine's offload_save, and offload_pack_filtered for a fresh activation (the hooks' copying save)
and for a weight's view (a kept save). Medians of 5 rounds of --calls calls (op_host_cost.per_call_us).

python3 benchmarks/results/cuda_call_cost.py [CALLS]"""
import itertools
import json
import sys

import torch

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from benchmarks.op_host_cost import per_call_us  # noqa: E402
from torch_offload._ops import offload_pack_filtered, offload_save  # noqa: E402

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 200
manager = torch_offload.OffloadManager(max_in_flight=0)  # the host never waits on a copy
mid = manager.id()
filter_id = manager.add_save_filter(0, False)
side = torch.cuda.Stream()
x = torch.empty(8 * 2**20, dtype=torch.bfloat16, device="cuda")  # 16 MB
pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
events = [torch.cuda.Event() for _ in range(calls)]
weight = torch.randn(1024, 1024, device="cuda", requires_grad=True)
base = torch.randn(8 * 2**20, device="cuda", dtype=torch.bfloat16, requires_grad=True)
fresh = []
recorded = itertools.count()


def make_activations():
    fresh.clear()
    fresh.extend(base * 2 for _ in range(calls))  # op outputs, each on its own storage


def record():
    events[next(recorded) % calls].record()


def side_waits():
    side.wait_event(events[0])


def torch_copy():
    with torch.cuda.stream(side):
        pinned.copy_(x, non_blocking=True)


row = {"calls": calls, "gpu": torch.cuda.get_device_name()}
events[0].record()
row["event_record_us"] = per_call_us(record, calls)
row["side_stream_wait_us"] = per_call_us(side_waits, calls)
row["torch_copy_to_pinned_on_side_stream_us"] = per_call_us(torch_copy, calls)
handles = []
row["offload_save_us"] = per_call_us(lambda: handles.append(offload_save(x, mid)), calls, between=handles.clear)
manager.synchronize()
saves = []


def pack_fresh():
    saves.append(offload_pack_filtered(fresh.pop(), mid, filter_id))


def reset_fresh():
    saves.clear()
    manager.synchronize()
    make_activations()


row["pack_filtered_copy_us"] = per_call_us(pack_fresh, calls, between=reset_fresh)
weight_view = weight.t()
row["pack_filtered_kept_us"] = per_call_us(lambda: offload_pack_filtered(weight_view, mid, filter_id), calls)
saves.clear()
manager.synchronize()
print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
