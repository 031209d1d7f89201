"""Host time of each save-hook op call in a 4k modules `*.self_attn` training step (issue 13): the
ops offload_pack_filtered and offload_unpack are wrapped with a timer (the wrapper's own cost, about
a microsecond, is inside the figures). Pack calls are split into those that made a new host copy,
those that shared one, those the filter kept, and leaves without grad the hooks were asked about
(their second call, after the hooks said "no weight", is counted with the others); unpacks into
those that restored their copy and those that shared a restore. Medians and totals per step, over STEPS steps after two warm-up steps.

python3 benchmarks/results/modules_pack_cost_4k.py [SEQ] [STEPS]"""
import json
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from torch_offload import activations  # noqa: E402
from torch_offload.save_filter import LEAF_WITHOUT_GRAD  # noqa: E402
from benchmarks.common import REFERENCE, TINY, build_llama, sync  # noqa: E402

warnings.simplefilter("ignore", torch_offload.NothingOffloadedWarning)
seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
shape, device = (REFERENCE, "cuda") if torch.cuda.is_available() else (TINY, "cpu")  # cpu: a smoke run
model = build_llama(shape, device, seq)
ids = torch.randint(0, shape["vocab"], (1, seq), device=device)

calls = {"pack_copy": [], "pack_shared": [], "pack_kept": [], "pack_leaf_asked": [], "unpack_restore": [],
         "unpack_shared": []}
seen_copies, seen_restores = set(), set()
pack_op, unpack_op = activations.offload_pack_filtered, activations.offload_unpack


def timed_pack(t, manager, filter_id, *not_a_weight):
    start = time.perf_counter()
    save, decision = pack_op(t, manager, filter_id, *not_a_weight)
    elapsed = time.perf_counter() - start
    if save is None:  # kept, or a leaf without grad the hooks are asked about (a second call follows)
        calls["pack_leaf_asked" if decision == LEAF_WITHOUT_GRAD else "pack_kept"].append(elapsed)
    else:
        buffer = save.untyped_storage().data_ptr()
        calls["pack_shared" if buffer in seen_copies else "pack_copy"].append(elapsed)
        seen_copies.add(buffer)
    return save, decision


def timed_unpack(save, device, manager):
    start = time.perf_counter()
    restored = unpack_op(save, device, manager)
    elapsed = time.perf_counter() - start
    storage = restored.untyped_storage().data_ptr()
    calls["unpack_shared" if storage in seen_restores else "unpack_restore"].append(elapsed)
    seen_restores.add(storage)
    return restored


activations.offload_pack_filtered, activations.offload_unpack = timed_pack, timed_unpack
torch_offload.apply(model, "modules", targets=["*.self_attn"], min_bytes=0 if device == "cpu" else 1 << 20)


def step():
    seen_copies.clear()
    seen_restores.clear()
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


for _ in range(2):
    step()
sync(device)
for kind in calls:
    calls[kind].clear()
start = time.perf_counter()
for _ in range(steps):
    step()
sync(device)
step_ms = (time.perf_counter() - start) / steps * 1e3
summary = {kind: {"per_step": round(len(times) / steps, 1),
                  "median_us": round(statistics.median(times) * 1e6, 1) if times else None,
                  "p90_us": round(sorted(times)[int(0.9 * len(times))] * 1e6, 1) if times else None,
                  "ms_per_step": round(sum(times) / steps * 1e3, 2)}
           for kind, times in calls.items()}
print(json.dumps({"seq": seq, "steps": steps, "step_ms": round(step_ms, 1), "calls": summary}, indent=1))
