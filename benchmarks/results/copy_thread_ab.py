"""Issue 13 (session 15; needs the library built with session15_copy_launcher.patch, not kept): copies
issued by the threads that run forward and backward, against copies issued by a launcher thread
(TORCH_OFFLOAD_COPY_THREAD=1, read at each copy), in one process, interleaved
rounds whose order alternates; plain training (none) and torch's checkpoint (ckpt) as baselines.

    python3 benchmarks/results/copy_thread_ab.py [SEQ] [ROUNDS] [MODES]

Per variant: the median step, its ratio to plain training's (none's step / the variant's; for the
checkpointing modes read it against ckpt's row), the median per round, and the compute stream's wait.
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
modes = (sys.argv[3] if len(sys.argv) > 3 else "modules,hidden_states,selective").split(",")
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
variants = ["none", "ckpt"] + [f"{m}@{w}" for m in modes for w in ("caller", "thread")]


def enable(v):
    if v == "none":
        return None, lambda: None
    if v == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return None, model.gradient_checkpointing_disable
    mode, where = v.split("@")
    os.environ["TORCH_OFFLOAD_COPY_THREAD"] = "1" if where == "thread" else "0"
    opts = {"targets": ["*.self_attn"]} if mode == "modules" else {}
    handle = torch_offload.apply(model, mode, **opts)
    return handle, handle.remove


def step():
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()


times = {v: [] for v in variants}
waits = {v: [] for v in variants}
for r in range(rounds):
    for v in (variants if r % 2 == 0 else variants[::-1]):
        handle, undo = enable(v)
        try:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            before = handle.stats()["compute_wait_ms"] if handle is not None else 0.0
            for _ in range(5):
                t = time.perf_counter(); step(); torch.cuda.synchronize()
                times[v].append(time.perf_counter() - t)
            if handle is not None:
                waits[v].append((handle.stats()["compute_wait_ms"] - before) / 5)
        finally:
            undo()
            os.environ.pop("TORCH_OFFLOAD_COPY_THREAD", None)
base = statistics.median(times["none"])
print(f"seq {seq}, {rounds} interleaved rounds of 5 steps (median step; ratio = the variant's step / plain training's)")
for v, ts in times.items():
    per_round = [statistics.median(ts[i:i + 5]) * 1e3 for i in range(0, len(ts), 5)]
    wait = f"  compute wait {statistics.median(waits[v]):.2f} ms/step" if waits[v] else ""
    print(f"{v:22s} {statistics.median(ts) * 1e3:7.1f} ms  {statistics.median(ts) / base:.3f}x  rounds "
          + " ".join(f"{x:.1f}" for x in per_round) + wait)
