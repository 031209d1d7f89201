"""Issue 13 (session 22): where inside the decoder layers, outside self_attn, does modules mode add
host time (+1.8-3.5 ms per 4k step in modules_host_split_4k.py, against +0.4 with every save kept)?
Plain training, modules with every save kept (`modules_keep`) and modules (`*.self_attn`), each on
its own model copy, step by step (order rotating, a sync at each step's end). A perf_counter_ns
mark at each decoder layer's, input_layernorm's, self_attn's, post_attention_layernorm's and mlp's
entry and exit (entry hooks run first, exit hooks last); per step, the host time summed per kind,
and the layers' remainder (residual adds, the layer's own Python); printed: medians of the
per-set differences against plain training.

    python3 benchmarks/results/modules_layer_split_4k.py [SEQ] [SETS]

LAYER_SPLIT_PIN=1: one more variant, `modules_pinned`, whose steps run with the forward's thread
alone on CPU 0 and every other thread of the process (the engine's releaser, autograd's) on the
other CPUs (affinities set before each of its steps and reset after): is the host code after our
work slower because another thread shares its core?
LAYER_SPLIT_SPIN_US=N: one more variant, `modules_keep_spin`, every save kept and the host busy for N us
(a Python loop on perf_counter) at the end of each self_attn call, about the time modules mode's
engine spends there: does the code after the call slow down from spending that time, or from what
the engine does in it?
LAYER_SPLIT_BLOCKING_SYNC=1: the CUDA context is made with CU_CTX_SCHED_BLOCKING_SYNC before torch
starts it, so every host wait on the GPU sleeps instead of spinning (the engine's releaser thread
spins in cudaEventSynchronize for each batch's copies, ~1.2 ms each, through most of the forward).
"""
import copy, ctypes, os, statistics, sys, threading, time, warnings
if os.environ.get("LAYER_SPLIT_BLOCKING_SYNC") == "1":
    cuda = ctypes.CDLL("libcuda.so.1")
    device = ctypes.c_int()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
    assert cuda.cuDevicePrimaryCtxSetFlags(device, 4) == 0  # CU_CTX_SCHED_BLOCKING_SYNC
    print("CUDA context: blocking sync", flush=True)
import torch
sys.path.insert(0, os.getcwd())
import torch_offload
from torch_offload.bench.common import REFERENCE as REF, build_llama

warnings.simplefilter("ignore")
seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
sets = int(sys.argv[2]) if len(sys.argv) > 2 else 30
KINDS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
base = build_llama(REF, "cuda", seq)
ids = torch.randint(0, REF["vocab"], (1, seq), device="cuda")
marks = []
models = {}
PIN = os.environ.get("LAYER_SPLIT_PIN") == "1"
ALL_CPUS = os.sched_getaffinity(0)


def pin(on):
    """The calling thread on CPU 0 and the process's other threads off it (on), or all anywhere."""
    main = threading.get_native_id()
    for tid in map(int, os.listdir("/proc/self/task")):
        cpus = ALL_CPUS if not on else ({0} if tid == main else ALL_CPUS - {0})
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass  # a thread that ended meanwhile


SPIN_US = float(os.environ.get("LAYER_SPLIT_SPIN_US", "0"))


def spin(module, args, output):
    end = time.perf_counter() + SPIN_US / 1e6
    while time.perf_counter() < end:
        pass


for variant in (("plain", "modules_keep", "modules") + (("modules_pinned",) if PIN else ())
                + (("modules_keep_spin",) if SPIN_US else ())):
    model = copy.deepcopy(base)
    if variant != "plain":
        torch_offload.apply(model, "modules", targets=["*.self_attn"],
                            **({"min_bytes": 1 << 62} if variant.startswith("modules_keep") else {}))
        if variant == "modules_keep_spin":
            for name, module in model.named_modules():
                if name.endswith("self_attn"):
                    module.register_forward_hook(spin)  # after modules mode's own exit hook
        model._pinned = variant == "modules_pinned"
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        kind = last if last in KINDS else "layer" if name.rsplit(".", 2)[-2:-1] == ["layers"] else None
        if kind is None:
            continue
        module.register_forward_pre_hook(lambda m, a, kind=kind: marks.append((kind, time.perf_counter_ns())),
                                         prepend=True)
        module.register_forward_hook(lambda m, a, o, kind=kind: marks.append((kind, time.perf_counter_ns())))
    models[variant] = model
del base


def spans():
    open_at, total = {}, {}
    for kind, ns in marks:
        if kind in open_at:
            total[kind] = total.get(kind, 0) + ns - open_at.pop(kind)
        else:
            open_at[kind] = ns
    out = {k: v / 1e6 for k, v in total.items()}
    out["remainder"] = out["layer"] - sum(out[k] for k in KINDS)
    return out


def step(model):
    pin(getattr(model, "_pinned", False))
    try:
        return pinned_step(model)
    finally:
        pin(False)


def pinned_step(model):
    marks.clear()
    t = time.perf_counter_ns()
    loss = model(ids, labels=ids).loss
    fwd = (time.perf_counter_ns() - t) / 1e6
    result = spans()
    result["fwd_host"] = fwd
    loss.backward()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    result["step"] = (time.perf_counter_ns() - t) / 1e6
    return result


for model in models.values():
    for _ in range(4):
        step(model)
names = list(models)
rows = {v: [] for v in names}
for i in range(sets):
    order = names[i % len(names):] + names[:i % len(names)]
    for v in order:
        rows[v].append(step(models[v]))
cols = ("step", "fwd_host", "layer") + KINDS + ("remainder",)
print(f"seq {seq}, {sets} sets: host ms per step, medians; then medians of per-set differences against plain")
print(f"{'variant':14s}" + "".join(f"{c[:12]:>13s}" for c in cols))
for v in names:
    print(f"{v:14s}" + "".join(f"{statistics.median(r[c] for r in rows[v]):13.2f}" for c in cols))
for v in names[1:]:
    print(f"{v + ' - plain':14s}" + "".join(
        f"{statistics.median(a[c] - b[c] for a, b in zip(rows[v], rows['plain'])):13.2f}" for c in cols))
