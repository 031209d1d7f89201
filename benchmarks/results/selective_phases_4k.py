"""Issue 10, selective "attention" at 4k: where its step loses against torch's checkpoint. Per variant,
interleaved rounds: the forward's host time (call returned) and its end on the GPU, the backward's
host time and its end on the GPU, and the manager's compute / host waits per step.

    python3 benchmarks/results/selective_phases_4k.py [SEQ] [ROUNDS] [VARIANTS]

Variants: ckpt, ckpt_re (torch's checkpoint), hidden_states, selective, selective_nocopy (the same
interception, every output under min_bytes so nothing is copied), and *_re (our reentrant ones).
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
variants = (sys.argv[3] if len(sys.argv) > 3 else
            "ckpt,hidden_states,selective,selective_nocopy,ckpt_re,hidden_states_re,selective_re").split(",")
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")


def enable(v):
    if v in ("ckpt", "ckpt_re"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": v == "ckpt_re"})
        return None, model.gradient_checkpointing_disable
    reentrant = v.endswith("_re")
    name = v[:-3] if reentrant else v
    opts = {"use_reentrant": True} if reentrant else {}
    if name == "selective_nocopy":
        name, opts["min_bytes"] = "selective", 1 << 40
    h = torch_offload.apply(model, name, **opts)
    return h, h.remove


def step(rows, handle):
    model.zero_grad(set_to_none=True)
    before = handle.stats() if handle is not None else {}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    loss.backward()
    t3 = time.perf_counter()
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    after = handle.stats() if handle is not None else {}
    rows.append(dict(fwd_host=t1 - t0, fwd=t2 - t0, bwd_host=t3 - t2, bwd=t4 - t2, step=(t2 - t0) + (t4 - t2),
                     compute_wait=after.get("compute_wait_ms", 0) - before.get("compute_wait_ms", 0),
                     host_wait=after.get("host_wait_ms", 0) - before.get("host_wait_ms", 0)))


results = {v: [] for v in variants}
for r in range(rounds):
    order = variants if r % 2 == 0 else variants[::-1]
    for v in order:
        handle, undo = enable(v)
        try:
            warm = []
            for _ in range(3):
                step(warm, handle)
            for _ in range(5):
                step(results[v], handle)
        finally:
            undo()
base = statistics.median(x["step"] for x in results[variants[0]])
print(f"seq {seq}, {rounds} rounds of 5 steps, medians in ms (ratio: {variants[0]}'s step / the variant's)")
for v, rows in results.items():
    med = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
    print(f"{v:18s} step {med['step']*1e3:7.1f} ({base/med['step']:.3f}x)  fwd host {med['fwd_host']*1e3:6.1f} "
          f"fwd {med['fwd']*1e3:6.1f}  bwd host {med['bwd_host']*1e3:6.1f} bwd {med['bwd']*1e3:6.1f}  "
          f"compute wait {med['compute_wait']:5.2f} host wait {med['host_wait']:5.2f}")
