"""Issue 10 (session 16): hidden_states and selective against torch's checkpointing, step by step in
one process, each variant on its own copy of the model (same weights, applied once), so that
nothing is applied or removed between steps and the host's speed and the GPU's clocks, which drift
between rounds, are shared by each set of steps.

    python3 benchmarks/results/stepwise_models_issue10.py [SEQ] [SETS] [VARIANTS]

VARIANTS (comma-separated): ckpt (the model's gradient_checkpointing_enable, use_reentrant=False),
ckpt_re (torch's reentrant checkpoint), hidden, hidden_re, selective ("attention"), selective_re;
for issue 13 (session 17): plain (plain training), modules (mode "modules", `*.self_attn`),
modules_mifN (the same with max_in_flight=N), any of those + "_nobatch" (each copy issued on its own);
modules_nosave (mode "modules" applied, its module hooks running, but no saved-tensor hooks entered:
what the module hooks cost by themselves); session 18: any of hidden / selective + "_torchhooks" (our
checkpoint through torch's non-reentrant implementation, its Python hooks, as before session 18;
without the suffix the hooks are the C ones of torch_offload/nonreentrant.py); selective + "_modepath"
(the attention call served by the dispatch mode in forward and recompute, as before session 18's
stand_in.py); session 19: hidden_nocopy (hidden_states with every block input kept on the GPU, uncopied);
session 20: torch_sac (torch's selective checkpointing with the policy that keeps the attention
outputs on the GPU: what the "attention" policy gives with no copy at all), modules_keep (mode "modules" with min_bytes=2**62: every save goes through the hooks and
the engine's filter and stays on the GPU), any of hidden / selective + "@GB" (keep_on_device_bytes: the newest saves, up to GB, stay on the GPU).
Per variant: the median step, its peak allocated memory, and the median and mean over the sets of
checkpointing's step / the variant's step (>1: faster than checkpointing); with "plain", the
variant's step / plain training's (>1: slower). Session 19: each variant's 10th / 90th percentile and
slowest step, and the time Python's garbage collector ran during its steps (gc.callbacks; mean per
step, and the steps it ran in); STEPWISE_GC_FREEZE=1 moves every object made before the timed steps
(the models, torch, transformers) out of the collector's reach (gc.freeze()).
"""
import copy, functools, gc, os, statistics, sys, time
import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts
sys.path.insert(0, os.getcwd())
import importlib
import torch_offload
from torch_offload import policies
from torch_offload.bench.common import REFERENCE as REF, build_llama

seq = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
sets = int(sys.argv[2]) if len(sys.argv) > 2 else 12
variants = (sys.argv[3] if len(sys.argv) > 3 else "ckpt,hidden,selective").split(",")
base = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
models, handles = {}, {}
for v in variants:
    model = copy.deepcopy(base)
    if v.startswith("ckpt"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": v == "ckpt_re"})
    elif v == "torch_sac":  # torch's selective checkpointing keeping the attention outputs on the GPU
        context_fn = functools.partial(create_selective_checkpoint_contexts, policies.attention_save)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False,
                                                                           "context_fn": context_fn})
    elif v.startswith("modules"):
        name, _, nobatch = v.partition("_nobatch")
        options = {"max_in_flight": int(name[len("modules_mif"):])} if name.startswith("modules_mif") else {}
        if name == "modules_keep":  # every save kept by the engine's filter: the hooks' cost without copies
            options["min_bytes"] = 1 << 62
        handles[v] = torch_offload.apply(model, "modules", targets=["*.self_attn"], **options)
        handles[v].modules.hooks.batch_copies = not v.endswith("_nobatch")
        if v == "modules_nosave":
            from no_save_hooks import NoSaveHooks  # beside this script
            handles[v].modules.hooks = NoSaveHooks()
    elif v != "plain":
        mode = "selective" if v.startswith("selective") else "hidden_states"
        options = {"policy": "attention"} if mode == "selective" else {}
        if "@" in v:
            options["keep_on_device_bytes"] = int(float(v.partition("@")[2]) * 1e9)
        if v == "hidden_nocopy":  # every block input kept on the GPU: checkpointing's work, no copy
            options["keep_on_device_bytes"] = 10 ** 12
        if v.partition("@")[0].removesuffix("_torchhooks").removesuffix("_modepath").endswith("_re"):
            options["use_reentrant"] = True
        handles[v] = torch_offload.apply(model, mode, **options)
    models[v] = model
del base


checkpoint_module = importlib.import_module("torch_offload.checkpoint")
c_hooks_serve = checkpoint_module._c_hooks_serve
attention_module = importlib.import_module("torch_offload.attention_offload")
frame_of_context = attention_module.frame_of_context


def step(v):
    checkpoint_module._c_hooks_serve = (lambda debug: False) if v.endswith("_torchhooks") else c_hooks_serve
    attention_module.frame_of_context = (lambda: None) if v.endswith("_modepath") else frame_of_context
    model = models[v]
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - t0) * 1e3
    model.zero_grad(set_to_none=True)  # between steps only the copies' weights stay
    return elapsed, torch.cuda.max_memory_allocated() / 1e9


gc_ms = [0.0]  # the collector's time since the counter was last read
_gc_start = [0.0]


def _on_gc(phase, info):
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        gc_ms[0] += (time.perf_counter() - _gc_start[0]) * 1e3


for i in range(2 * len(variants)):
    step(variants[i % len(variants)])
if os.environ.get("STEPWISE_GC_FREEZE") == "1":
    gc.collect()
    gc.freeze()
gc.callbacks.append(_on_gc)
gc_times = {v: [] for v in variants}
times = {v: [] for v in variants}
peaks = {v: 0.0 for v in variants}
for i in range(sets):
    shift = i % len(variants)
    for v in variants[shift:] + variants[:shift]:
        gc_ms[0] = 0.0
        ms, peak = step(v)
        times[v].append(ms)
        gc_times[v].append(gc_ms[0])
        peaks[v] = max(peaks[v], peak)
resident = sum(p.numel() * p.element_size() for p in models[variants[0]].parameters()) / 1e9
print(f"seq {seq}, {sets} sets of one step per variant (order rotating), {len(variants)} model copies "
      f"(peaks include every copy's weights: {resident:.2f} GB each); medians in ms")
for v in variants:
    speed = [c / t for c, t in zip(times["ckpt"], times[v])] if "ckpt" in times else []
    extra = (f"  ckpt / variant: median {statistics.median(speed):.4f}x, mean {statistics.mean(speed):.4f}x"
             if speed and v != "ckpt" else "")
    if "plain" in times and v != "plain":
        slower = [t / p for p, t in zip(times["plain"], times[v])]
        extra += f"  variant / plain: median {statistics.median(slower):.4f}x, mean {statistics.mean(slower):.4f}x"
    print(f"{v:15s} {statistics.median(times[v]):8.1f} ms  peak {peaks[v]:6.2f} GB{extra}")
for v in variants:
    deciles = statistics.quantiles(times[v], n=10)
    collected = sum(1 for t in gc_times[v] if t > 0)
    print(f"{v:15s} p10 {deciles[0]:.1f}  p90 {deciles[-1]:.1f}  slowest {max(times[v]):.1f} ms; "
          f"garbage collector {statistics.mean(gc_times[v]):.2f} ms per step, in {collected} of {len(gc_times[v])} steps"
          f"{' (gc.freeze)' if os.environ.get('STEPWISE_GC_FREEZE') == '1' else ''}")
