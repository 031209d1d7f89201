"""Is hidden_states' ~1% deficit to checkpointing at 16k (issue 10) made by our code or by where it
runs? Interleaved rounds whose order alternates (even rounds in the order below, odd rounds reversed,
so no variant always runs right after another), one process per allocator setting:

  ckpt           HF gradient_checkpointing_enable, non-reentrant (the baseline)
  torch_wrapped  torch's checkpoint around each layer's forward, the way our handle wraps it
  hidden         apply(mode="hidden_states")
  hidden_nocopy  the same with every save kept on the GPU (keep_on_device_bytes=1e12): no copies
  ckpt_shifted   ckpt with 100 MB more held on the GPU from before its first step (the caching
                 allocator then places the step's tensors elsewhere: does placement alone move it?)

Per variant: the median of all timed steps, its ratio to ckpt's (ckpt time / variant time), and the
median per position in the round order.

PYTORCH_CUDA_ALLOC_CONF=... python3 benchmarks/results/hidden_order_16k.py [SEQ] [ROUNDS]"""
import json
import os
import statistics
import sys

import torch
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, ".")
import torch_offload  # noqa: E402
from benchmarks.common import reference_from_argv, timed_steps  # noqa: E402

seq, rounds, model, ids = reference_from_argv(16384, 4)


def hf_ckpt():
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.gradient_checkpointing_disable


def torch_wrapped():
    layers = list(model.model.layers)
    for layer in layers:
        forward = layer.forward
        layer.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)

    def undo():
        for layer in layers:
            del layer.forward
    return undo


def ckpt_shifted():
    held = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
    disable = hf_ckpt()

    def undo():
        nonlocal held
        held = None
        disable()
    return undo


VARIANTS = {
    "ckpt": hf_ckpt,
    "torch_wrapped": torch_wrapped,
    "hidden": lambda: torch_offload.apply(model, mode="hidden_states").remove,
    "hidden_nocopy": lambda: torch_offload.apply(model, mode="hidden_states", keep_on_device_bytes=int(1e12)).remove,
    "ckpt_shifted": ckpt_shifted,
}


def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


times = {v: [] for v in VARIANTS}
by_position = {v: {} for v in VARIANTS}
for r in range(rounds):
    order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
    for position, name in enumerate(order):
        undo = VARIANTS[name]()
        step()
        torch.cuda.synchronize()
        measured = timed_steps(step, 3, seq, "cuda")["times_s"]
        undo()
        torch.cuda.empty_cache()
        times[name] += measured
        by_position[name].setdefault(position, []).extend(measured)
    print(json.dumps({"round": r, "order": order, **{v: round(statistics.median(t[-3:]), 4) for v, t in times.items()}}),
          flush=True)

base = statistics.median(times["ckpt"])
summary = {v: {"median_s": round(statistics.median(t), 4), "vs_ckpt": round(base / statistics.median(t), 4),
               "by_position": {p: round(statistics.median(s), 4) for p, s in sorted(by_position[v].items())}}
           for v, t in times.items()}
print(json.dumps({"seq": seq, "rounds": rounds, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                  "summary": summary}, indent=1), flush=True)
