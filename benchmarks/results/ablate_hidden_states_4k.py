"""Where hidden_states (non-reentrant) loses to torch's checkpoint at 4k on the GPU: ablations,
interleaved rounds, median step time."""
import statistics, sys, time, json
import torch
sys.path.insert(0, ".")
import torch_offload
ck = sys.modules["torch_offload.checkpoint"]
from torch_offload.bench.common import REFERENCE, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
model = build_llama(REFERENCE, "cuda", seq)
ids = torch.randint(0, REFERENCE["vocab"], (1, seq), device="cuda")
import gc, os
if os.environ.get("TORCH_OFFLOAD_GC_FREEZE"):  # everything alive now leaves the collector's generations
    gc.collect(); gc.freeze()
real = (ck.offload_save, ck.offload_restore)

def setup(v):
    if v == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}); return model.gradient_checkpointing_disable
    if v == "ckpt_re":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True}); return model.gradient_checkpointing_disable
    if v == "hidden": return torch_offload.apply(model, "hidden_states").remove
    if v == "hidden_re": return torch_offload.apply(model, "hidden_states", use_reentrant=True).remove
    if v == "hidden_no_prefetch": return torch_offload.apply(model, "hidden_states", prefetch_depth=0).remove
    if v == "hidden_no_copy":
        ck.offload_save = lambda x, mid: x
        ck.offload_restore = lambda h, dev, mid: h
        class NoFinish:
            def __init__(self, m): self.m = m
            def __getattr__(self, n): return getattr(self.m, n)
            def finish_save(self, handle): pass
        h = torch_offload.apply(model, "hidden_states", manager=NoFinish(torch_offload.OffloadManager()))
        def undo():
            ck.offload_save, ck.offload_restore = real
            h.remove()
        return undo
    raise ValueError(v)

def step():
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)

variants = sys.argv[2].split(",")
times = {v: [] for v in variants}
for r in range(5):
    for v in variants:
        undo = setup(v)
        step(); step()
        torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            t = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
        undo()
        times[v].append(statistics.median(ts))
res = {v: round(statistics.median(t) * 1e3, 1) for v, t in times.items()}
print(seq, json.dumps(res))
print(json.dumps({v: [round(x * 1e3, 1) for x in t] for v, t in times.items()}))
