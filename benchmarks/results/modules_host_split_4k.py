"""Issue 13 (session 21): where the 4k modules step's extra host time sits, inside the selected
self_attn calls or outside them. Plain training, modules with every save kept (`modules_keep`,
min_bytes=2**62) and modules (`*.self_attn`; "_wc": its host memory allocated write-combined,
TORCH_OFFLOAD_HOST_WRITE_COMBINED=1 while applied; "_timed": its pack hook and batch calls timed
from Python, adding a wrapper's cost to each; "_poll", "_bm", "_bmo", "_tiny": see step(); "_nodefer": every save through the engine at once,
as before session 21's deferred saves; "modules_mifN": max_in_flight=N; "_bg": hooks.background = True, with
session21_background_worker.patch applied), each on its own model copy, step by step (order
rotating). Every copy gets the same timing hooks (a perf_counter_ns read at each decoder layer's and
each self_attn's entry and exit: the entry hook runs first, the exit hook last, so the self_attn
span includes modules mode's own module hooks and its batch of copies). Per step: the forward's host
time split into self_attn calls, the rest of the layers, and outside the layers; backward's host
time (until backward() returns); the forward's end on the GPU (CUDA events); the step. Printed:
medians per variant and the median of the per-set differences against plain training.

    python3 benchmarks/results/modules_host_split_4k.py [SEQ] [SETS] [VARIANTS]

Session 22: HOST_SPLIT_GC=off runs every variant with Python's garbage collector disabled
(gc.disable() once the models are built), =freeze with the objects that exist then frozen
(gc.freeze(): collections no longer walk the model's objects).
"""
import copy, gc, os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload._ops import offload_batch
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
sets = int(sys.argv[2]) if len(sys.argv) > 2 else 30
variants = (sys.argv[3] if len(sys.argv) > 3 else "plain,modules_keep,modules").split(",")
base = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
models = {}
marks = []  # (kind, name, ns) of the running step
hook_ns = {}  # "_timed" variants: host time in the save hooks' calls during the running step


def timed(name, function, classify=None):
    def call(*args):
        start = time.perf_counter_ns()
        result = function(*args)
        key = name if classify is None else f"{name}_{classify(result)}"
        hook_ns[key] = hook_ns.get(key, 0) + time.perf_counter_ns() - start
        return result
    return call


def time_hooks(hooks):
    """Wraps the pack hook (split by its answer: a SavedView, or kept) and the batch's begin / end."""
    hooks.pack_hook = timed("pack", hooks.pack_hook,
                            lambda r: "kept" if isinstance(r, torch.Tensor) else "offloaded")
    hooks._begin_batch = timed("begin_batch", hooks._begin_batch)
    hooks._end_batch = timed("end_batch", hooks._end_batch)
for v in variants:
    model = copy.deepcopy(base)
    if v != "plain":
        options = {"min_bytes": 1 << 62} if v.startswith("modules_keep") else {}
        if v.startswith("modules_mif"):  # max_in_flight=N (copies in flight before a batch waits)
            options["max_in_flight"] = int(v[len("modules_mif"):].partition("_")[0])
        # "_wc": the engine's host memory write-combined (session 21's experiment, read at creation)
        os.environ["TORCH_OFFLOAD_HOST_WRITE_COMBINED"] = "1" if "_wc" in v else "0"
        # "_nogroup": backward's prefetch one entry at a time and every compute wait made, as
        # before session 22 (session22_experiment_no_group.patch, read at creation)
        os.environ["TORCH_OFFLOAD_EXPERIMENT_NO_GROUP"] = "1" if "_nogroup" in v else "0"
        # session 23 (read when the manager is made, by the library built with
        # session23_fence_cache_untimed_waits.patch and session23_held_saves_one_call.patch; without
        # them these variants are plain "modules"): "_untimed": compute waits without their timing
        # events; "_nocache": fences forget that they completed (each query and wait asks the driver);
        # "_persave": each save asked on its own (weights and small tensors at once, the held saves in
        # one op call each at the batch's end), as before session 23
        for flag, name in (("_untimed", "TORCH_OFFLOAD_EXPERIMENT_UNTIMED_WAITS"),
                           ("_nocache", "TORCH_OFFLOAD_EXPERIMENT_NO_FENCE_CACHE"),
                           ("_persave", "TORCH_OFFLOAD_EXPERIMENT_PER_SAVE")):
            if flag in v:
                os.environ[name] = "1"
            else:
                os.environ.pop(name, None)
        handle = torch_offload.apply(model, "modules", targets=["*.self_attn"], **options)
        if "_nodefer" in v:  # the engine's batch without the C hooks' deferred saves (before session 21)
            hooks, manager_id = handle.modules.hooks, handle.modules.manager.id()
            hooks._begin_batch = lambda manager_id=manager_id: offload_batch(manager_id, True)
            hooks._end_batch = lambda manager_id=manager_id: offload_batch(manager_id, False)
        if "_bg" in v:  # the held saves go to the engine on a worker thread (pyext/held_worker.h)
            handle.modules.hooks.background = True
        if v.endswith("_timed"):
            time_hooks(handle.modules.hooks)
    for name, module in model.named_modules():
        if name.endswith("self_attn") or name.endswith(tuple(f"layers.{i}" for i in range(100))):
            kind = "attn" if name.endswith("self_attn") else "layer"
            module.register_forward_pre_hook(
                lambda m, a, kind=kind: marks.append((kind, 0, time.perf_counter_ns())), prepend=True)
            module.register_forward_hook(
                lambda m, a, o, kind=kind: marks.append((kind, 1, time.perf_counter_ns())))
    models[v] = model
del base
gc_mode = os.environ.get("HOST_SPLIT_GC", "on")
if gc_mode == "off":
    gc.disable()
elif gc_mode == "freeze":
    gc.collect()
    gc.freeze()
print("garbage collector:", gc_mode, flush=True)


def spans(kind):
    total, start = 0, None
    for k, edge, ns in marks:
        if k == kind:
            if edge == 0:
                start = ns
            else:
                total += ns - start
    return total / 1e6


# Session 23: HOST_SPLIT_HEAD_START_MS=N queues a GPU sleep of about N ms before each step, so that
# the host queues the forward while the GPU is busy and the GPU then runs it without waiting for the
# host (with copies in flight unbounded, "modules_mif0", the host never waits for the GPU either):
# "step" and "fwd_gpu" are then GPU times alone (from the sleep's end). Void with the reference
# model: its forward waits for the GPU near its start (the causal mask), spending the head start.
head_start_cycles = int(float(os.environ.get("HOST_SPLIT_HEAD_START_MS", "0")) * 1.7e6)


def step(v):
    model = models[v]
    # session 21's experiment switches, read by the engine at each wait / batch: "_poll" (the
    # releaser polls each copy's event every 50 us instead of the driver's spinning wait), "_bm" /
    # "_bmo" (a batch's copies in one cudaMemcpyBatchAsync; "o": preferring overlap with compute)
    os.environ["TORCH_OFFLOAD_FENCE_POLL_US"] = "50" if "_poll" in v else "0"
    os.environ["TORCH_OFFLOAD_BATCH_MEMCPY"] = "1o" if "_bmo" in v else "1" if "_bm" in v else "0"
    os.environ["TORCH_OFFLOAD_TINY_COPY"] = "1" if "_tiny" in v else "0"  # 4 KB per copy: no traffic
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    marks.clear()
    hook_ns.clear()
    begin, forward_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if head_start_cycles:
        torch.cuda._sleep(head_start_cycles)  # the GPU busy while the host queues the step's work
    t0 = time.perf_counter_ns()
    begin.record()
    loss = model(input_ids=ids, labels=ids).loss
    forward_end.record()
    t1 = time.perf_counter_ns()
    loss.backward()
    t2 = time.perf_counter_ns()
    if head_start_cycles:
        backward_end = torch.cuda.Event(enable_timing=True)
        backward_end.record()
    torch.cuda.synchronize()
    t3 = time.perf_counter_ns()
    attn, layers = spans("attn"), spans("layer")
    forward = (t1 - t0) / 1e6
    # with a head start, the step on the GPU alone (from the end of the sleep)
    step_ms = begin.elapsed_time(backward_end) if head_start_cycles else (t3 - t0) / 1e6
    return {"step": step_ms, "fwd_host": forward, "attn": attn, "layer_rest": layers - attn,
            "outside": forward - layers, "fwd_gpu": begin.elapsed_time(forward_end),
            "bwd_host": (t2 - t1) / 1e6, "bwd_tail": (t3 - t2) / 1e6,
            **{k: ns / 1e6 for k, ns in sorted(hook_ns.items())}}


for i in range(2 * len(variants)):
    step(variants[i % len(variants)])
rows = {v: [] for v in variants}
for i in range(sets):
    shift = i % len(variants)
    for v in variants[shift:] + variants[:shift]:
        rows[v].append(step(v))
keys = list(rows[variants[0]][0])[:8]
print(f"seq {seq}, {sets} sets, medians in ms (attn: the self_attn calls' host time; layer_rest: the "
      f"rest of the decoder layers; outside: the forward outside the layers; fwd_gpu: the forward's end "
      f"on the GPU; bwd_host: until backward() returned; bwd_tail: then until the GPU finished)")
print(f"{'variant':14s}" + "".join(f"{k:>11s}" for k in keys))
for v in variants:
    print(f"{v:14s}" + "".join(f"{statistics.median(r[k] for r in rows[v]):11.2f}" for k in keys))
for v in variants:
    if v.endswith("_timed"):
        print(f"{v}: host ms per step in the save hooks' calls (medians): " + ", ".join(
            f"{k} {statistics.median(r.get(k, 0.0) for r in rows[v]):.2f}" for k in sorted(rows[v][0])[::-1]
            if k not in keys))
if "plain" in rows:
    print("median of per-set differences against plain")
    for v in variants:
        if v != "plain":
            print(f"{v:14s}" + "".join(
                f"{statistics.median(a[k] - p[k] for a, p in zip(rows[v], rows['plain'])):11.2f}" for k in keys))
    for v in variants:
        if v != "plain":
            ratio = statistics.median(a["step"] / p["step"] for a, p in zip(rows[v], rows["plain"]))
            print(f"{v}: step / plain median {ratio:.4f}x")
