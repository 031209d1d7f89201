"""Where modules `*.self_attn` loses its time at 4k (issue 13: <= 1.10x plain training). Interleaved
rounds of variants that each take one cost away:

  none          plain training (the baseline)
  identity      the same modules run under bare Python saved-tensor hooks (lambda t: t both ways):
                the floor of any hook-based save path
  modules       apply(mode="modules", targets=["*.self_attn"])
  nocopy        the same with every save kept on the GPU (keep_on_device_bytes=1e12): the hooks and
                the engine's table, no copy over the link
  unbounded     modules with max_in_flight=0 (forward never waits for copies)
  prefetch16    modules with prefetch_depth=16 (4: about one layer's saves ahead at 4k)

Per variant: median step of all rounds, ratio to none, and the manager's stats of the last round
(host_wait_ms: the forward's stall on copies; bytes each way).

python3 benchmarks/results/modules_decompose_4k.py [SEQ] [ROUNDS]"""
import json
import statistics
import sys
import warnings

import torch

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from benchmarks.common import reference_from_argv, timed_steps  # noqa: E402

warnings.simplefilter("ignore", torch_offload.NothingOffloadedWarning)
seq, rounds, model, ids = reference_from_argv(4096, 5)


def modules(**options):
    return torch_offload.apply(model, "modules", targets=["*.self_attn"], **options)


class _BareHooks(torch.autograd.graph.saved_tensors_hooks):
    def __init__(self, modules_hooks):
        super().__init__(lambda t: t, lambda t: t)
        self.filter = modules_hooks.filter  # the modules handle resets its record each forward


def identity():
    handle = modules()
    handle.modules.hooks = _BareHooks(handle.modules.hooks)
    return handle


VARIANTS = {
    "none": lambda: None,
    "identity": identity,
    "modules": modules,
    "nocopy": lambda: modules(keep_on_device_bytes=int(1e12)),
    "unbounded": lambda: modules(max_in_flight=0),
    "prefetch16": lambda: modules(prefetch_depth=16),
}


def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


times = {v: [] for v in VARIANTS}
stats = {}
for r in range(rounds):
    for name, enable in VARIANTS.items():
        handle = enable()
        step()
        step()
        torch.cuda.synchronize()
        if handle is not None:
            handle.manager.reset_stats()
        times[name] += timed_steps(step, 5, seq, "cuda")["times_s"]
        if handle is not None:
            s = handle.stats()
            stats[name] = {k: s.get(k) for k in ("host_wait_ms", "compute_wait_ms", "bytes_to_host", "bytes_to_device", "saves",
                                                 "saved_tensors", "offloaded_saves", "shared_saves", "kept_saves", "bytes_kept_on_device")}
            handle.manager.empty_pool()
            handle.remove()
    print(json.dumps({"round": r, **{v: round(statistics.median(t[-5:]), 4) for v, t in times.items()}}), flush=True)

base = statistics.median(times["none"])
summary = {v: {"median_s": round(statistics.median(t), 4), "vs_none": round(statistics.median(t) / base, 3),
               "stats_per_5_steps": stats.get(v)} for v, t in times.items()}
print(json.dumps({"seq": seq, "rounds": rounds, "summary": summary}, indent=1), flush=True)
