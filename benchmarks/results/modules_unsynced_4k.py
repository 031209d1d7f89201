"""Issue 13 (session 22): the 4k modules step with and without a device sync after every step.
bench_modules times each step between syncs, so each forward starts with the GPU idle and a
host-bound forward shows in full. A training loop that does not read the loss every step (Hugging
Face's Trainer keeps it on the device between logging steps) lets the host run ahead: backward's
host work ends well before the GPU's, and the next forward starts with that lead. Plain training and
modules (`*.self_attn`), each on its own model copy, in alternating rounds: STEPS steps between two
syncs (time per step), and STEPS steps each between syncs (median); printed: medians over rounds and
the ratios to plain training.

    python3 benchmarks/results/modules_unsynced_4k.py [SEQ] [ROUNDS] [STEPS] [MAX_IN_FLIGHT,...]

With MAX_IN_FLIGHT values, one more modules copy per value ("modules_mifN": that many copies in
flight before a batch waits; the default 4 makes each batch of 5 wait for the whole previous one,
which ties the host to the copies' progress at every selected call).
"""
import copy, os, statistics, sys, time, warnings
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

warnings.simplefilter("ignore")
seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 10
base = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
models = {"plain": base, "modules": copy.deepcopy(base)}
torch_offload.apply(models["modules"], "modules", targets=["*.self_attn"])
for n in (int(v) for v in sys.argv[4].split(",")) if len(sys.argv) > 4 else ():
    models[f"modules_mif{n}"] = copy.deepcopy(base)
    torch_offload.apply(models[f"modules_mif{n}"], "modules", targets=["*.self_attn"], max_in_flight=n)


def step(model):
    model(ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


def unsynced(model):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step(model)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e3


def synced(model):
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step(model)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


for model in models.values():
    for _ in range(5):
        step(model)
results = {(v, kind): [] for v in models for kind in ("unsynced", "synced")}
for r in range(rounds):
    for v in list(models)[r % len(models):] + list(models)[:r % len(models)]:
        results[(v, "unsynced")].append(unsynced(models[v]))
        results[(v, "synced")].append(synced(models[v]))
print(f"seq {seq}, {rounds} rounds of {steps} steps; ms per step, median over rounds")
for kind in ("unsynced", "synced"):
    plain = statistics.median(results[("plain", kind)])
    for v in list(models)[1:]:
        mod = statistics.median(results[(v, kind)])
        ratios = [m / p for m, p in zip(results[(v, kind)], results[("plain", kind)])]
        print(f"{kind:9s} plain {plain:7.2f}  {v} {mod:7.2f}  ratio of medians {mod / plain:.4f}x  "
              f"per-round ratios {min(ratios):.3f}-{max(ratios):.3f}x")
