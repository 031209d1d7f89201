"""Session 15 experiment (with the library built from session15_fence_poll_experiment.patch): does the
releaser thread, spinning in cudaEventSynchronize while it waits for each copy, slow the threads that
launch the step? One process, interleaved rounds: each mode with the releaser spinning and with it
polling every 50 us (TORCH_OFFLOAD_FENCE_POLL, read at every wait), beside torch's checkpoint.

    python3 benchmarks/results/fence_poll_ab_4k.py [SEQ] [ROUNDS] [MODES]
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
modes = (sys.argv[3] if len(sys.argv) > 3 else "hidden_states,selective,modules").split(",")
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
variants = ["ckpt"] + [f"{m}@{w}" for m in modes for w in ("spin", "poll")]


def enable(v):
    if v == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model.gradient_checkpointing_disable
    mode, wait = v.split("@")
    if wait == "poll":
        os.environ["TORCH_OFFLOAD_FENCE_POLL"] = "1"
    else:
        os.environ.pop("TORCH_OFFLOAD_FENCE_POLL", None)
    opts = {"targets": ["*.self_attn"]} if mode == "modules" else {}
    return torch_offload.apply(model, mode, **opts).remove


def step():
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()


times = {v: [] for v in variants}
for r in range(rounds):
    for v in (variants if r % 2 == 0 else variants[::-1]):
        undo = enable(v)
        try:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            for _ in range(5):
                t = time.perf_counter(); step(); torch.cuda.synchronize()
                times[v].append(time.perf_counter() - t)
        finally:
            undo()
            os.environ.pop("TORCH_OFFLOAD_FENCE_POLL", None)
base = statistics.median(times["ckpt"])
print(f"seq {seq}, {rounds} interleaved rounds of 5 steps (median step, ratio = ckpt's step / the variant's)")
for v, ts in times.items():
    per_round = [statistics.median(ts[i:i + 5]) * 1e3 for i in range(0, len(ts), 5)]
    print(f"{v:22s} {statistics.median(ts) * 1e3:7.1f} ms  {base / statistics.median(ts):.3f}x  rounds "
          + " ".join(f"{x:.1f}" for x in per_round))
