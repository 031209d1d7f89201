"""Issue 13 (session 16): the C save hooks against the Python ones in a 4k modules `*.self_attn`
step, alternated step by step inside one applied handle (both hook sets on the handle's manager, the
same kept storages and record), and against no save hooks at all in the selected modules ("none":
plain training plus the module hooks' own cost), so that the host's speed, which drifts between
rounds, is shared by each triple. Per hook set: the host's forward time (until the loss is returned), the forward thread's
CPU time in it, and the whole step; medians and the median of the paired differences.

    python3 benchmarks/results/modules_hooks_alternating_4k.py [SEQ] [SETS] [all]

With "poll", one more set: the C hooks with the releaser polling (needs the library built with
session15_fence_poll_experiment.patch). With "all", two more sets: Python identity hooks (bare: what any saved-tensor hook costs in torch)
and C hooks that keep every save (kept: the engine's decision per save, nothing copied).
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from no_save_hooks import NoSaveHooks  # beside this script
from torch_offload import _library, activations
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 60
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
handle = torch_offload.apply(model, "modules", targets=["*.self_attn"]).modules
c_hooks = handle.hooks
assert hasattr(c_hooks.pack_hook, "__self__"), "the C save hooks did not load"
activations.load_save_hooks = lambda: None
python_hooks = activations.offload_activations("all", keep=activations.resident_tensors(model), record_offloaded=True,
                                               warn_on_exit=False, manager=handle.manager)
activations.load_save_hooks = _library.load_save_hooks


_NoSaveHooks = NoSaveHooks  # no_save_hooks.py


class _BareHooks(torch.autograd.graph.saved_tensors_hooks):
    """Python identity hooks: what any saved-tensor hook costs in torch, nothing of ours."""
    filter = _NoSaveHooks.filter

    def __init__(self):
        super().__init__(lambda t: t, lambda t: t)


hook_sets = {"c": c_hooks, "python": python_hooks, "none": _NoSaveHooks()}
if len(sys.argv) > 3 and sys.argv[3] == "poll":
    hook_sets["c@poll"] = c_hooks
if len(sys.argv) > 3 and sys.argv[3] == "all":
    # kept: C hooks whose filter keeps every save (min_bytes above any tensor): the engine's
    # decision for each save, no copy, no table entry.
    hook_sets.update(bare=_BareHooks(), kept=activations.offload_activations(
        "all", min_bytes=1 << 62, keep=activations.resident_tensors(model), warn_on_exit=False,
        manager=handle.manager))
rows = {name: {"step": [], "forward": [], "forward_cpu": []} for name in hook_sets}


def step(name):
    # "NAME@poll": NAME's hooks with TORCH_OFFLOAD_FENCE_POLL set for the step (a build with
    # session15_fence_poll_experiment.patch: the releaser polls each copy's event instead of spinning).
    hooks_name, _, poll = name.partition("@")
    if poll:
        os.environ["TORCH_OFFLOAD_FENCE_POLL"] = "1"
    else:
        os.environ.pop("TORCH_OFFLOAD_FENCE_POLL", None)
    handle.hooks = hook_sets[hooks_name]
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.thread_time()
    loss = model(input_ids=ids, labels=ids).loss
    t1, c1 = time.perf_counter(), time.thread_time()
    loss.backward()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t2 - t0) * 1e3, (t1 - t0) * 1e3, (c1 - c0) * 1e3


NAMES = list(hook_sets)
for i in range(2 * len(NAMES)):
    step(NAMES[i % len(NAMES)])
for i in range(pairs):
    shift = i % len(NAMES)
    for name in NAMES[shift:] + NAMES[:shift]:  # each set at each place in turn
        for key, value in zip(("step", "forward", "forward_cpu"), step(name)):
            rows[name][key].append(value)
print(f"seq {seq}, {pairs} sets of steps rotating the hook sets (order rotating); medians in ms")
for name, row in rows.items():
    print(f"{name:7s} step {statistics.median(row['step']):6.1f}  host forward {statistics.median(row['forward']):5.1f}"
          f"  forward thread CPU {statistics.median(row['forward_cpu']):5.1f}")
for a, b in (("python", "c"), ("c", "none"), ("python", "none"), ("bare", "none"), ("kept", "bare"), ("c", "kept"),
             ("c", "c@poll"), ("c@poll", "none")):
    if a not in rows or b not in rows:
        continue
    for key in ("step", "forward", "forward_cpu"):
        diffs = [x - y for x, y in zip(rows[a][key], rows[b][key])]
        print(f"{a} - {b}, {key}: median {statistics.median(diffs):+.2f} ms, mean {statistics.mean(diffs):+.2f} ms")
