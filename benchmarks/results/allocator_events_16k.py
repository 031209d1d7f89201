"""Issue 10: does hidden_states make the caching allocator go to the driver during a step (cudaMalloc /
cudaFree, retries after freeing cached blocks: each synchronizes or stalls the stream) where
checkpointing does not? And does the in-flight bound's hold on the host (hidden_mifN: max_in_flight=N,
0 unbounded) matter, or the compute stream's wait for each block input's copy before its device copy is
freed (hidden_nofinish: freed by the releaser instead)? And what the prefetch of backward's first
restores gives (selective; *_nohook: without it)? Interleaved rounds; per variant and step: the allocator's device allocations,
frees and retries, the step time, and the manager's compute / host waits.

    python3 benchmarks/results/allocator_events_16k.py [SEQ] [ROUNDS] [VARIANTS]
"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
variants = (sys.argv[3] if len(sys.argv) > 3 else "ckpt,hidden_states,hidden_nocopy").split(",")
model = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


class _NoFinishSave:
    """A manager stand-in for checkpoint() whose finish_save does nothing: the block input's device
    copy is then released by the releaser thread once it sees the copy done, instead of in stream
    order with the compute stream waiting for the copy (hidden_nofinish)."""

    def __init__(self, manager):
        self.manager = manager

    def id(self):
        return self.manager.id()

    def finish_save(self, handle):
        pass


def enable(v):
    if v == "hidden_nofinish":
        import torch_offload.modes.hidden_states as hidden_mode
        checkpoint = hidden_mode.checkpoint
        hidden_mode.checkpoint = lambda fn, *a, manager=None, **k: checkpoint(fn, *a, manager=_NoFinishSave(manager), **k)
        handle = torch_offload.apply(model, "hidden_states")

        def undo():
            handle.remove()
            hidden_mode.checkpoint = checkpoint
        return handle, undo
    if v == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return None, model.gradient_checkpointing_disable
    base, no_hook = (v[:-len("_nohook")], True) if v.endswith("_nohook") else (v, False)
    opts = {"keep_on_device_bytes": 10 ** 12} if base == "hidden_nocopy" else {}
    if base.startswith("hidden_mif"):  # hidden_mifN: max_in_flight=N (0: unbounded)
        opts["max_in_flight"] = int(base[len("hidden_mif"):])
    handle = torch_offload.apply(model, "selective" if base == "selective" else "hidden_states", **opts)
    if no_hook:  # *_nohook: without the prefetch of backward's first restores (first_restores.py)
        from torch_offload.first_restores import PrefetchFirstRestores
        hooks = model.lm_head._forward_hooks
        for key in [k for k, hook in hooks.items() if isinstance(hook, PrefetchFirstRestores)]:
            del hooks[key]
    return handle, handle.remove


rows = {v: [] for v in variants}
for r in range(rounds):
    for v in (variants if r % 2 == 0 else variants[::-1]):
        handle, undo = enable(v)
        try:
            for i in range(5):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                mem0 = torch.cuda.memory_stats()
                s0 = handle.stats() if handle else {}
                t = time.perf_counter()
                model.zero_grad(set_to_none=True)
                model(input_ids=ids, labels=ids).loss.backward()
                torch.cuda.synchronize()
                dt = time.perf_counter() - t
                mem1 = torch.cuda.memory_stats()
                s1 = handle.stats() if handle else {}
                row = {k: mem1.get(k, 0) - mem0.get(k, 0) for k in KEYS}
                row.update(step_ms=dt * 1e3, compute_wait=s1.get("compute_wait_ms", 0) - s0.get("compute_wait_ms", 0),
                           host_wait=s1.get("host_wait_ms", 0) - s0.get("host_wait_ms", 0),
                           reserved_gb=mem1["reserved_bytes.all.current"] / 2**30,
                           peak_gb=mem1["allocated_bytes.all.peak"] / 2**30, warm=i >= 2)
                rows[v].append(row)
        finally:
            undo()
for v, rs in rows.items():
    timed = [x for x in rs if x["warm"]]
    print(f"{v:14s} step {statistics.median(x['step_ms'] for x in timed):7.1f} ms  per step (all, incl. warm-up): "
          + "  ".join(f"{k} {[x[k] for x in rs]}" for k in KEYS))
    print(f"{'':14s} compute wait {[round(x['compute_wait'], 2) for x in timed]} host wait "
          f"{[round(x['host_wait'], 2) for x in timed]} reserved GB {[round(x['reserved_gb'], 2) for x in rs]}")
    print(f"{'':14s} peak allocated GB (timed steps) {sorted(set(round(x['peak_gb'], 3) for x in timed))}")
