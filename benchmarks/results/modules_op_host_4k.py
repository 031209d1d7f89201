"""Issue 13 (session 22): which host work grows outside the selected calls? modules mode makes the
decoder layers' host time outside self_attn grow (+1.8-3 ms per 4k step, against +0.4 with every
save kept). For plain training, modules with every save kept (`modules_keep`) and modules, a few
steps under the CPU-only profiler (lower overhead than with CUDA activity), each op's self host time
summed by where it ran: inside a self_attn call, inside an mlp call, or elsewhere; printed: per
scope, the ops whose total grew most against plain training.

    python3 benchmarks/results/modules_op_host_4k.py [SEQ] [STEPS]

Read with care (session 22, calls 8-9): the profiler put the engine's releaser thread's
cudaEventSynchronize (it waits for each batch's copies: 24 x ~1.2 ms = the 28.5 ms per step it
reports) under the main thread's "fwd" range, so "other" grows by that much in modules mode though
the forward's thread never waits on an event there.
"""
import collections, copy, os, sys, warnings
import torch
from torch.profiler import ProfilerActivity, profile, record_function
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

warnings.simplefilter("ignore")
seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # (CPU: a smoke run of the script)
if DEVICE == "cpu":
    from torch_offload.bench.common import TINY as REF
    torch.cuda.synchronize = lambda: None
base = build_llama(REF, DEVICE, seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device=DEVICE)


def mark(model):
    for name, module in model.named_modules():
        scope = "attn" if name.endswith("self_attn") else "mlp" if name.endswith(".mlp") else None
        if scope is None:
            continue
        def enter(m, a, scope=scope):
            m._range = record_function(scope)
            m._range.__enter__()
        def leave(m, a, o):
            m._range.__exit__(None, None, None)
        module.register_forward_pre_hook(enter, prepend=True)
        module.register_forward_hook(leave)


def totals(variant):
    model = copy.deepcopy(base)
    if variant != "plain":
        torch_offload.apply(model, "modules", targets=["*.self_attn"],
                            **({"min_bytes": 1 << 62} if variant == "modules_keep" else {}))
    mark(model)
    for _ in range(4):
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("fwd"):
                loss = model(ids, labels=ids).loss
            torch.cuda.synchronize()
            loss.backward()
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
    out = collections.Counter()
    syncs = collections.Counter()
    fwd_threads = {ev.thread for ev in prof.events() if ev.name == "fwd"}
    for ev in prof.events():
        if ev.name == "cudaEventSynchronize":  # who waits on the host, and inside what
            chain, parent = [], ev.cpu_parent
            while parent is not None and len(chain) < 4:
                chain.append(parent.name)
                parent = parent.cpu_parent
            where = "main thread" if ev.thread in fwd_threads else f"thread {ev.thread}"
            syncs[(where, " < ".join(chain) or "(no enclosing op)")] += ev.cpu_time_total / steps / 1e3

        scope, parent = None, ev.cpu_parent
        in_fwd = False
        while parent is not None:
            if parent.name in ("attn", "mlp") and scope is None:
                scope = parent.name
            if parent.name == "fwd":
                in_fwd = True
            parent = parent.cpu_parent
        if ev.name in ("attn", "mlp", "fwd"):
            out[("wall", ev.name)] += ev.cpu_time_total / steps / 1e3  # the scope's own span
            continue
        if not in_fwd:
            continue
        out[(scope or "other", ev.name)] += ev.self_cpu_time_total / steps / 1e3  # ms per step
    for (where, chain), ms in syncs.most_common(6):
        print(f"{variant}: cudaEventSynchronize {ms:.2f} ms per step on the {where}, in {chain}")
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return out


results = {v: totals(v) for v in ("plain", "modules_keep", "modules")}
print("host ms per step, wall of each scope (profiled): "
      + "; ".join(f"{name}: " + ", ".join(f"{v} {r[('wall', name)]:.2f}" for v, r in results.items())
                  for name in ("fwd", "attn", "mlp")))
for scope in ("attn", "mlp", "other"):
    keys = {k for r in results.values() for k in r if k[0] == scope}
    total = {v: sum(r[k] for k in keys) for v, r in results.items()}
    print(f"== {scope}: forward host ms per step (self time of ops, profiled): "
          + ", ".join(f"{v} {t:.2f}" for v, t in total.items()))
    rows = sorted(keys, key=lambda k: -(results["modules"][k] - results["plain"][k]))
    for k in rows[:12]:
        print(f"   {k[1][:48]:48s}" + "".join(f"{results[v][k]:9.3f}" for v in results)
              + f"   modules-plain {results['modules'][k] - results['plain'][k]:+.3f}")
