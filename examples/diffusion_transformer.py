#!/usr/bin/env python3
"""Activation offloading over the blocks of a video diffusion transformer: total memory and speed.

A Wan-style video DiT (diffusers' WanTransformer3DModel, random init) trains one step at a time with
a flow-matching loss (MSE between the predicted and the true velocity, noise - latents), five ways,
each on a fresh model loaded with the same weights and fed the same data:

  none            plain training: every activation stays in device memory
  checkpointing   torch gradient checkpointing of every block (diffusers'
                  model.enable_gradient_checkpointing(): torch.utils.checkpoint, non-reentrant)
  hidden_states   torch_offload.apply(model, "hidden_states", blocks=list(model.blocks)):
                  checkpointing, each block's input in pinned host memory until backward
  selective       torch_offload.apply(model, "selective", blocks=list(model.blocks)): hidden_states,
                  and the fused attention outputs of each block offloaded instead of recomputed
  torch_sac       torch's selective checkpointing of every block keeping the same attention outputs
                  on the GPU instead (diffusers' enable_gradient_checkpointing with a checkpoint whose
                  context_fn is create_selective_checkpoint_contexts(torch_offload.policies.
                  attention_save)): what selective skips of the recompute, with no copy at all

On a GPU (bf16): the shape of Wan2.1 T2V 1.3B (30 blocks, dim 1536, 12 heads, FFN 8960, 512 text
tokens of dim 4096) on the latents of 25 frames of 480x832 video (16 x 7 x 60 x 104, 10920 tokens).
Per variant it prints the peak allocated and reserved device memory, the model and optimizer state,
the pinned host memory the engine held and the median step time, with the ratios against
checkpointing; it writes a JSON record and two PNGs of the allocated memory through one step of
each variant (from the CUDA caching allocator's trace) into --out DIR.

It checks that the variants compute the same training: the first step's loss is bit-equal in all of
them (the same forward on the same weights and data); the first step's gradients are within a
relative L2 error of 1e-2 of checkpointing's, and later losses within 1e-2 relative (on a GPU the
attention backward may accumulate with atomics, flash attention's does, so gradients need not be
bit-reproducible from run to run, even for one variant; the example prints how far checkpointing is
from itself when the first step runs twice). On CPU (a tiny fp32 model, seconds) every loss and the first step's gradients
must be bit-equal to checkpointing's; there is no device memory to measure there (the engine copies
host to host), so memory is reported as not measured. The variants run in the order --variants
gives, so that rounds can alternate it: each one's first-step gradients wait in host memory (2.8 GB
at the GPU size) until all have run.

    python examples/diffusion_transformer.py --out DIR             # GPU if there is one, else CPU
    python examples/diffusion_transformer.py --device cpu           # the tiny CPU check

Needs diffusers (pip install diffusers==0.42.1); matplotlib for the PNG (optional).
"""
import argparse
import datetime
import functools
import gc
import json
import math
import platform
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

try:
    import torch_offload
except ImportError:  # running from a source checkout: examples/.. holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch_offload

try:
    import diffusers
    from diffusers import WanTransformer3DModel
except ImportError:
    raise SystemExit("examples/diffusion_transformer.py needs diffusers: pip install diffusers==0.42.1")

GB = 1e9
# Wan2.1 T2V 1.3B's transformer; latents of 25 frames of 480x832 video (the Wan VAE compresses time
# 4x and space 8x: 1 + 24/4 = 7 latent frames of 60 x 104), 10920 tokens after the 1x2x2 patches.
GPU_SIZE = dict(layers=30, heads=12, head_dim=128, ffn=8960, text_dim=4096, freq_dim=256, channels=16,
                frames=7, height=60, width=104, text_tokens=512, batch=1, warmup=2, steps=6, lr=1e-4)
# Tiny, but each attention output (256 tokens x 128 x 4 bytes) is at least selective's min_bytes
# (64 KiB), so the CPU run offloads the attention outputs too.
CPU_SIZE = dict(layers=2, heads=4, head_dim=32, ffn=256, text_dim=32, freq_dim=32, channels=4,
                frames=4, height=16, width=16, text_tokens=16, batch=1, warmup=1, steps=3, lr=1e-3)
VARIANTS = ("none", "checkpointing", "hidden_states", "selective", "torch_sac")
REFERENCE = "checkpointing"  # runs first: its step-1 gradients are what the others are compared with
# GPU tolerances (bf16; see the docstring). A wrong restored tensor changes a block's gradients, and
# through its input gradient every earlier block's, by far more than this.
GRAD_RTOL = 1e-2
LOSS_RTOL = 1e-2
TRACE_ENTRIES = 2_000_000


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--out", type=Path, default=None,
                   help="folder for the JSON record and (on a GPU) the memory timeline PNGs")
    for name, kind in (("layers", int), ("heads", int), ("head_dim", int), ("ffn", int), ("text_dim", int),
                       ("freq_dim", int), ("channels", int), ("frames", int), ("height", int), ("width", int),
                       ("text_tokens", int), ("batch", int), ("warmup", int), ("steps", int), ("lr", float)):
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                       help="default: %s on GPU, %s on CPU" % (GPU_SIZE[name], CPU_SIZE[name]))
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="comma-separated, from %s, run in the order given (checkpointing always runs: it is "
                        "the reference; first when not named)" % ", ".join(VARIANTS))
    p.add_argument("--prefetch-depth", type=int, default=None,
                   help="selective's prefetch_depth (default: the library's, 3: one attention call per block; "
                        "a Wan block makes two, self- and cross-attention: up to 5 saves)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads on CPU runs (default 1: the model is tiny)")
    args = p.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    for name, value in (GPU_SIZE if args.device == "cuda" else CPU_SIZE).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    # The order given is the run order, so that rounds can alternate it; the reference always runs.
    args.variants = list(dict.fromkeys(chosen if REFERENCE in chosen else [REFERENCE] + chosen))
    if args.warmup < 1 or args.steps < 1:
        p.error("--warmup and --steps must be at least 1 (the first warm-up step is the one compared)")
    return args


def build_model(args, device, dtype):
    torch.manual_seed(0)
    with torch.device(device):
        model = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=args.heads, attention_head_dim=args.head_dim,
            in_channels=args.channels, out_channels=args.channels, text_dim=args.text_dim, freq_dim=args.freq_dim,
            ffn_dim=args.ffn, num_layers=args.layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        )
    # As from_pretrained(torch_dtype=dtype) leaves them: the modules the class keeps in fp32 (time
    # embedding, modulation tables, norms, rotary tables) stay fp32, the rest is `dtype`.
    keep = set(model._keep_in_fp32_modules or ())
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if tensor.is_floating_point():
                tensor.data = tensor.data.to(torch.float32 if keep & set(name.split(".")) else dtype)
    return model.train()


def make_batch(args, device, dtype):
    """Random latents, noise and text embeddings; one flow-matching sample per video."""
    gen = torch.Generator().manual_seed(1)
    shape = (args.batch, args.channels, args.frames, args.height, args.width)
    latents, noise = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    sigma = torch.rand(args.batch, generator=gen)
    s = sigma.view(-1, 1, 1, 1, 1)
    return {
        "hidden_states": ((1 - s) * latents + s * noise).to(device, dtype),
        "timestep": (sigma * 1000).to(device),
        "encoder_hidden_states": torch.randn(args.batch, args.text_tokens, args.text_dim, generator=gen).to(device, dtype),
        "target": (noise - latents).to(device, torch.float32),  # the velocity
    }


def compute_loss(model, batch):
    pred = model(batch["hidden_states"], batch["timestep"], batch["encoder_hidden_states"], return_dict=False)[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["target"])


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def grads_of(model):
    """The parameters' gradients, by name, where they are."""
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def compare_grads(grads, reference):
    """Gradients against the reference's: bit-equal?, relative L2 error over all parameters, and the
    parameter with the largest relative error."""
    if set(grads) != set(reference):
        missing = sorted(set(reference) ^ set(grads))
        return {"bit_equal": False, "rel_l2": math.inf, "worst": f"gradients differ in which exist: {missing[:5]}",
                "worst_rel": math.inf}
    bit_equal, diff_sq, ref_sq, worst, worst_rel = True, 0.0, 0.0, None, 0.0
    for name, grad in grads.items():
        ref = reference[name].to(grad.device)
        bit_equal = bit_equal and torch.equal(grad, ref)
        d = (grad.float() - ref.float()).norm().item()
        r = ref.float().norm().item()
        diff_sq, ref_sq = diff_sq + d * d, ref_sq + r * r
        rel = d / r if r > 0 else (0.0 if d == 0 else math.inf)
        if rel > worst_rel:
            worst, worst_rel = name, rel
    return {"bit_equal": bit_equal, "rel_l2": math.sqrt(diff_sq / ref_sq) if ref_sq > 0 else 0.0,
            "worst": worst, "worst_rel": worst_rel}


def enable(variant, model, prefetch_depth=None):
    """Turns the variant on; returns our handle (None for torch's variants)."""
    blocks = list(model.blocks)  # WanTransformerBlock: called with (hidden_states, text, temb, rotary)
    if variant == "checkpointing":
        model.enable_gradient_checkpointing()
    elif variant == "torch_sac":
        model.enable_gradient_checkpointing(selective_checkpoint)
    elif variant == "hidden_states":
        return torch_offload.apply(model, "hidden_states", blocks=blocks)
    elif variant == "selective":
        # The named policy intercepts torch.nn.functional.scaled_dot_product_attention, which
        # diffusers' default ("native") attention backend calls through the module attribute.
        options = {} if prefetch_depth is None else {"prefetch_depth": prefetch_depth}
        return torch_offload.apply(model, "selective", blocks=blocks, policy="attention", **options)
    return None


def selective_checkpoint(module, *args):
    """diffusers' checkpoint of a block, with torch's selective checkpointing saving the fused
    attention outputs (the ops torch_offload's "attention" policy names) instead of recomputing them."""
    context_fn = functools.partial(create_selective_checkpoint_contexts, torch_offload.policies.attention_save)
    return checkpoint(module.__call__, *args, use_reentrant=False, context_fn=context_fn)


def record_timeline(step, device):
    """One step under the CUDA caching allocator's trace: [(host time in ms, allocated bytes)] after
    each allocation and free, the event indices where forward and backward ended, and the step's
    max_memory_allocated. The trace's sizes are the requested ones (the counters round up to 512 B)."""
    memory = torch.cuda.memory
    index = device.index if device.index is not None else torch.cuda.current_device()
    marks = {}

    def mark(name):  # at a phase's end: how many events the trace holds by then
        torch.cuda.synchronize()
        marks[name] = len(memory._snapshot()["device_traces"][index])

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        memory._record_memory_history(max_entries=TRACE_ENTRIES, context=None, stacks="python", clear_history=True)
    except Exception:  # noqa: BLE001 (an older signature): record with stack traces instead
        memory._record_memory_history(max_entries=TRACE_ENTRIES, stacks="python")
    try:
        step(mark)
        torch.cuda.synchronize()
        events = memory._snapshot()["device_traces"][index]
    finally:
        memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated()
    # x: each event's time (the host's, when the allocator was called), in ms from the first event;
    # where the trace has no times, the event's index.
    timed = bool(events) and all(e.get("time_us") is not None for e in events)
    xs = [(e["time_us"] - events[0]["time_us"]) / 1e3 for e in events] if timed else list(range(len(events)))
    line, current = [(0.0, base)], base
    for x, event in zip(xs, events):
        if event["action"] == "alloc":
            current += event["size"]
        elif event["action"] == "free_completed":
            current -= event["size"]
        else:
            continue
        line.append((x, current))
    phase_ends = {name: xs[min(n, len(xs)) - 1] for name, n in marks.items() if n > 0 and xs}
    return {"line": line, "x_unit": "ms" if timed else "allocator event", "phase_ends": phase_ends,
            "base_bytes": base, "max_memory_allocated": peak, "events": len(events),
            "truncated": len(events) >= TRACE_ENTRIES}


def thin(line, points=2000):
    """At most about `points` (x, bytes) pairs; each kept pair is the largest of its stretch, so the
    peak survives."""
    stride = max(1, len(line) // points)
    return [max(line[i:i + stride], key=lambda p: p[1]) for i in range(0, len(line), stride)]


def run_variant(variant, args, device, dtype, state, batch):
    model = build_model(args, device, dtype)
    model.load_state_dict(state)
    handle = enable(variant, model, args.prefetch_depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    result = {"variant": variant, "losses": []}

    # Step 1: its gradients are kept (in host memory) to be compared with the reference's once all ran.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        loss = compute_loss(model, batch)
        loss.backward()
        sync(device)
        result["first_step_forward_backward_s"] = time.perf_counter() - t0
    result["warnings"] = sorted({str(w.message) for w in caught if "torch_offload" in str(w.message)})
    result["step1_grads"] = {n: g.detach().to("cpu", copy=True) for n, g in grads_of(model).items()}
    if variant == REFERENCE:
        # The same step again: how far the reference is from itself (the GPU's run-to-run noise, which
        # the other variants' differences are to be read against; 0 on CPU).
        optimizer.zero_grad(set_to_none=True)
        again = compute_loss(model, batch)
        again.backward()
        result["self_loss_equal"] = again.item() == loss.item()
        result["grads_vs_itself"] = compare_grads(grads_of(model), result["step1_grads"])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    result["losses"].append(loss.item())

    def step(mark=None):
        loss = compute_loss(model, batch)
        if mark is not None:
            mark("forward")
        loss.backward()
        if mark is not None:
            mark("backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup - 1):  # later warm-up steps: pinned buffers reused, kernels chosen
        result["losses"].append(step().item())
    if handle is not None:
        handle.manager.synchronize()
        torch_offload.reset_stats(handle.manager)
    sync(device)
    if device.type == "cuda":
        result["state_bytes"] = torch.cuda.memory_allocated()  # data + weights + optimizer state, no grads
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        loss = step()
        sync(device)
        times.append(time.perf_counter() - t0)
        result["losses"].append(loss.item())
    result["step_s"] = statistics.median(times)
    result["step_s_all"] = times
    if device.type == "cuda":
        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    if handle is not None:
        handle.manager.synchronize()
        s = handle.stats()
        result["offload"] = {
            "saves_per_step": s["saves"] / args.steps,
            "bytes_to_host_per_step": s["bytes_to_host"] / args.steps,
            "host_bytes_peak": s["host_bytes_peak"],
            "pinned": bool(s.get("pinned")),
            "prefetch_hits": s["prefetch_hits"], "restores": s["restores"],
            "compute_wait_ms_per_step": s["compute_wait_ms"] / args.steps,
        }
    if device.type == "cuda":
        try:
            result["timeline"] = record_timeline(step, device)
        except Exception as error:  # noqa: BLE001 (the figures above stand without the picture)
            result["timeline_error"] = f"{type(error).__name__}: {error}"
    if handle is not None:
        handle.remove()
    if variant == "checkpointing":
        model.disable_gradient_checkpointing()
    return result  # the model, its optimizer and gradients go with this frame


def warm_up(args, device, dtype):
    """Two training steps of the tiny model on the device, the second checkpointed: what torch
    allocates once and keeps (cuBLAS workspaces among it) is allocated now, before the baseline that
    every variant must start from: for the forward, for autograd's backward thread, and for
    checkpointing's recompute of the forward on that thread (1 MiB that a checkpointed variant
    would otherwise leave behind when an uncheckpointed one ran first)."""
    tiny = argparse.Namespace(**{**vars(args), **CPU_SIZE})
    model = build_model(tiny, device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tiny.lr, fused=device.type == "cuda")
    batch = make_batch(tiny, device, dtype)
    for checkpointed in (False, True):
        if checkpointed:
            model.enable_gradient_checkpointing()
        compute_loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync(device)


def run_all(args, device, dtype, batch, failures):
    """Every variant on a fresh model from the same state, in the order given; returns the results
    (each variant's step-1 gradients compared with the reference's), the number of parameters and the
    baseline (the data's bytes on the device)."""
    baseline = 0
    if device.type == "cuda":
        warm_up(args, device, dtype)
        gc.collect()
        baseline = torch.cuda.memory_allocated(device)
    reference_model = build_model(args, device, dtype)
    n_params = sum(p.numel() for p in reference_model.parameters())
    state = {k: v.detach().to("cpu", copy=True) for k, v in reference_model.state_dict().items()}
    del reference_model
    results, settled = {}, None
    for index, variant in enumerate(args.variants):
        # Nothing of the previous variant may remain on the device: its memory would count in this one's.
        # The first variant may leave what torch allocates once per process and keeps (a fused
        # optimizer's or a kernel's buffers the tiny warm-up did not reach); from then on every variant
        # starts where the second did, or something of a variant stayed behind.
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            left = torch.cuda.memory_allocated(device) - baseline
            if index == 1:
                settled = left
                if left:
                    print(f"  (the first variant left {left} bytes that every later one starts with)", flush=True)
            elif index > 1 and left != settled:
                failures.append(f"{variant} started with {left - settled} bytes more allocated than the variant "
                                "before it")
        started = time.perf_counter()
        try:
            result = run_variant(variant, args, device, dtype, state, batch)
        except torch.cuda.OutOfMemoryError as error:
            result = {"variant": variant, "error": f"out of memory: {str(error).splitlines()[0]}"}
            if variant == REFERENCE:
                raise
        if device.type == "cuda":
            result["allocated_before_bytes"] = left + baseline
        results[variant] = result
        print(f"  {variant}: {result.get('error', 'median step %.1f ms' % (result.get('step_s', 0) * 1e3))} "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
    reference = results[REFERENCE].pop("step1_grads")
    for result in results.values():
        if "step1_grads" in result:
            result["grads_vs_reference"] = compare_grads(result.pop("step1_grads"), reference)
    return results, n_params, baseline


def check(results, device, failures):
    """The variants compute the same training (module docstring)."""
    ref = results[REFERENCE]
    lines = []
    for name, r in results.items():
        if "error" in r:
            continue
        if device.type == "cpu":
            if r["losses"] != ref["losses"]:
                failures.append(f"{name}: losses {r['losses']} differ from checkpointing's {ref['losses']}")
        else:
            if r["losses"][0] != ref["losses"][0]:
                failures.append(f"{name}: step-1 loss {r['losses'][0]!r} is not bit-equal to checkpointing's "
                                f"{ref['losses'][0]!r}")
            rel = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref["losses"]))
            r["loss_max_rel_diff"] = rel
            if rel > LOSS_RTOL:
                failures.append(f"{name}: a loss differs from checkpointing's by {rel:.2e} relative (> {LOSS_RTOL})")
        g = r.get("grads_vs_reference")
        if g is not None:
            if device.type == "cpu" and not g["bit_equal"]:
                failures.append(f"{name}: step-1 gradients are not bit-equal to checkpointing's "
                                f"(relative L2 {g['rel_l2']:.2e}, worst {g['worst']})")
            if device.type == "cuda" and not g["rel_l2"] <= GRAD_RTOL:
                failures.append(f"{name}: step-1 gradients differ from checkpointing's by {g['rel_l2']:.2e} "
                                f"relative L2 (> {GRAD_RTOL}); worst {g['worst']} ({g['worst_rel']:.2e})")
            lines.append(f"{name} {'bit-equal' if g['bit_equal'] else 'rel. L2 %.1e' % g['rel_l2']}")
    return lines


def gb(n):
    return f"{n / GB:.2f}"


def main():
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    started = time.perf_counter()
    tokens = args.frames * (args.height // 2) * (args.width // 2)
    dim = args.heads * args.head_dim
    width = torch.empty(0, dtype=dtype).element_size()
    info = {"where": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "dtype": str(dtype).replace("torch.", ""), "tokens": tokens, "dim": dim,
            "boundary": args.layers * args.batch * tokens * dim * width}
    print(f"Wan-style video DiT (diffusers {diffusers.__version__} WanTransformer3DModel, random init) on "
          f"{info['where']}: {args.layers} blocks, dim {dim}, {args.heads} heads, FFN {args.ffn}, {info['dtype']}")
    print(f"latents {args.batch} x {args.channels} x {args.frames} x {args.height} x {args.width} -> {tokens} video "
          f"tokens per sample, {args.text_tokens} text tokens; flow-matching MSE, AdamW; {args.warmup} warm-up + "
          f"{args.steps} timed steps per variant")
    print(f"block inputs (the checkpoint boundaries): {args.layers} x {args.batch * tokens} x {dim} x {width} B = "
          f"{info['boundary'] / 1e6:.1f} MB per step")

    batch = make_batch(args, device, dtype)
    failures = []
    results, info["params"], info["baseline"] = run_all(args, device, dtype, batch, failures)
    summarize(args, device, dtype, info, results, failures)
    print(f"(total {time.perf_counter() - started:.1f} s)")
    if failures:
        raise SystemExit(1)


def summarize(args, device, dtype, info, results, failures):
    """Checks the results, prints them and, with --out, writes the JSON and the PNGs."""
    cuda = device.type == "cuda"
    grad_lines = check(results, device, failures)
    selective = results.get("selective", {}).get("offload")
    if selective is not None:
        # Each block offloads one tensor for its input (all that hidden_states offloads); what selective
        # saves beyond that are the attention outputs its interception of SDPA caught.
        attention_saves = selective["saves_per_step"] - args.layers
        results["selective"]["attention_saves_per_step"] = attention_saves
        if attention_saves <= 0:
            failures.append("selective offloaded no attention output: SDPA was not intercepted")

    ref = results[REFERENCE]
    host_unit, host_scale = ("engine host GB", GB) if cuda else ("engine host MB", 1e6)
    print()
    print(f"{info['params'] / 1e6:.1f}M parameters; ratios against checkpointing")
    header = (f"{'variant':>14} | {'peak alloc GB':>13} | {'x ckpt':>6} | {'peak reserved GB':>16} | "
              f"{'state GB':>8} | {'step ms':>8} | {'speed x ckpt':>12} | {host_unit:>14}")
    print(header)
    print("-" * len(header))
    for name in VARIANTS:
        r = results.get(name)
        if r is None:
            continue
        if "error" in r:
            print(f"{name:>14} | {r['error']}")
            continue
        if cuda:
            mem = (f"{gb(r['peak_allocated_bytes']):>13} | "
                   f"{r['peak_allocated_bytes'] / ref['peak_allocated_bytes']:6.3f} | "
                   f"{gb(r['peak_reserved_bytes']):>16} | {gb(r['state_bytes'] - info['baseline']):>8}")
        else:
            mem = f"{'n/a':>13} | {'n/a':>6} | {'n/a':>16} | {'n/a':>8}"
        host = f"{r['offload']['host_bytes_peak'] / host_scale:14.2f}" if "offload" in r else f"{'-':>14}"
        print(f"{name:>14} | {mem} | {r['step_s'] * 1e3:8.1f} | {ref['step_s'] / r['step_s']:12.3f} | {host}")
    print()
    if cuda:
        print("peak alloc / reserved: torch.cuda.max_memory_allocated / max_memory_reserved over the timed steps "
              "(weights, AdamW state, gradients, activations, the data); x ckpt: peak alloc over checkpointing's; "
              "state: weights and AdamW state between steps; speed x ckpt: checkpointing's median step time over "
              "the variant's (>1: faster); engine host: pinned host memory holding the offloaded tensors (peak)")
    else:
        print("memory is not measured on CPU: there is no device memory, and the engine's \"offload\" is a "
              "host-to-host copy (engine host MB: what it held). CPU step times say nothing "
              "about a GPU's.")
    for name, r in results.items():
        o = r.get("offload")
        if o is not None:
            print(f"{name:>14}: engine {o['saves_per_step']:.0f} saves and {o['bytes_to_host_per_step'] / 1e6:.1f} MB "
                  f"to host per step, {o['prefetch_hits']:.0f}/{o['restores']:.0f} restores prefetched, compute "
                  f"stream waited {o['compute_wait_ms_per_step']:.1f} ms per step")
        for message in r.get("warnings", []):
            print(f"{name:>14}: warning: {message}")
    if selective is not None:
        print(f"selective offloaded {results['selective']['attention_saves_per_step']:.0f} attention tensors per step "
              f"(outputs, and logsumexps of at least min_bytes) beside the {args.layers} block inputs: diffusers' "
              "SDPA calls were intercepted")
    print("losses:")
    for name, r in results.items():
        if "error" not in r:
            print(f"{name:>14}: " + " ".join(f"{x:.6f}" for x in r["losses"]))
    noise = ref["grads_vs_itself"]
    print(f"checkpointing against itself (step 1 run twice): loss {'bit-equal' if ref['self_loss_equal'] else 'differs'}"
          f", gradients {'bit-equal' if noise['bit_equal'] else 'rel. L2 %.1e' % noise['rel_l2']}")
    if cuda:
        worst = max((r.get("loss_max_rel_diff", 0.0) for r in results.values()), default=0.0)
        print(f"step-1 losses bit-equal (asserted); later losses within {worst:.1e} relative of checkpointing's "
              f"(asserted <= {LOSS_RTOL}); step-1 gradients against checkpointing's (relative L2, asserted <= "
              f"{GRAD_RTOL}): " + ", ".join(grad_lines))
    else:
        print("step-1 gradients against checkpointing's: " + ", ".join(grad_lines))
    if args.out is not None:
        write_outputs(args, device, dtype, info, results, failures)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
    elif cuda:
        print("every variant computed the same training as checkpointing, within the tolerances above")
    else:
        print("losses and step-1 gradients bit-equal to checkpointing's in every variant")


def write_outputs(args, device, dtype, info, results, failures):
    cuda = device.type == "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    pngs = plot_timelines(results, args.out, info["where"]) if cuda else []
    record = {
        "command": shlex.join(["python"] + sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__, "cuda": torch.version.cuda,
                     "python": platform.python_version()},
        "device": info["where"],
        "device_total_memory_bytes": torch.cuda.get_device_properties(device).total_memory if cuda else None,
        "memory_measured": cuda,
        "config": {"model": "diffusers WanTransformer3DModel, random init", "params": info["params"],
                   "dtype": info["dtype"], "video_tokens_per_sample": info["tokens"], "dim": info["dim"],
                   "boundary_bytes": info["boundary"], "data_bytes": info["baseline"],
                   "optimizer": "AdamW (fused)" if cuda else "AdamW",
                   "selective_prefetch_depth": args.prefetch_depth,
                   **{k: getattr(args, k) for k in GPU_SIZE}},
        "reference": REFERENCE,
        "run_order": list(results),
        "checks": {"asserted": ("step-1 loss bit-equal; step-1 gradients (relative L2) within grad_rtol and every "
                                "loss within loss_rtol (relative) of the reference's" if cuda else
                                "every loss and the step-1 gradients bit-equal to the reference's"),
                   "grad_rtol": GRAD_RTOL if cuda else 0.0, "loss_rtol": LOSS_RTOL if cuda else 0.0,
                   "failures": failures},
        "variants": {},
        "pngs": [p.name for p in pngs],
    }
    ref = results[REFERENCE]
    for name, r in results.items():
        row = {k: v for k, v in r.items() if k != "timeline"}
        if "error" not in r:
            row["speed_vs_checkpointing"] = ref["step_s"] / r["step_s"]
            if cuda:
                row["peak_allocated_vs_checkpointing"] = r["peak_allocated_bytes"] / ref["peak_allocated_bytes"]
                row["state_bytes_without_data"] = r["state_bytes"] - info["baseline"]
        timeline = r.get("timeline")
        if timeline is not None:
            row["timeline"] = {k: v for k, v in timeline.items() if k != "line"}
            row["timeline"]["trace_peak_bytes"] = max(b for _, b in timeline["line"])
            row["timeline"]["points"] = [[round(x, 3), b] for x, b in thin(timeline["line"])]
        record["variants"][name] = row
    path = args.out / "diffusion_transformer.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}" + "".join(f", {p}" for p in pngs))


def plot_timelines(results, out, where):
    """memory_timeline.png: allocated memory through one step, one panel per variant (own scale);
    memory_timeline_overlay.png: all variants on one axis."""
    timed = {n: results[n]["timeline"] for n in VARIANTS if results.get(n, {}).get("timeline")}
    if not timed:
        return []
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib); the JSON holds each timeline")
        return []
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    unit = next(iter(timed.values()))["x_unit"]
    figure, axes = plt.subplots(len(timed), 1, figsize=(10, 2.4 * len(timed)), sharex=True, squeeze=False)
    overlay_figure, overlay = plt.subplots(figsize=(10, 4.5))
    for axis, (name, t) in zip(axes[:, 0], timed.items()):
        xs, ys = [x for x, _ in t["line"]], [b / GB for _, b in t["line"]]
        peak = max(ys, default=0.0)
        axis.plot(xs, ys, linewidth=1.0)
        axis.fill_between(xs, ys, alpha=0.15)
        axis.axhline(t["base_bytes"] / GB, color="black", linestyle="--", linewidth=0.8)
        axis.annotate("weights, AdamW state, data", (xs[0], t["base_bytes"] / GB), xytext=(2, -10),
                      textcoords="offset points", fontsize=7)
        for phase, x in t["phase_ends"].items():
            axis.axvline(x, color="gray", linestyle=":", linewidth=0.8)
            axis.annotate(f"{phase} ends", (x, 0), xytext=(2, 2), textcoords="offset points", fontsize=7,
                          color="gray")
        axis.set_ylim(0, peak * 1.1 if peak > 0 else 1)
        axis.set_ylabel("GB")
        axis.set_title(f"{name}: peak {peak:.2f} GB", fontsize=9, loc="left")
        axis.grid(True, alpha=0.3)
        overlay.plot(xs, ys, linewidth=1.0, label=f"{name} (peak {peak:.2f} GB)")
    label = f"one training step: forward, backward, optimizer step ({unit}, host time of each allocation)"
    axes[-1, 0].set_xlabel(label)
    figure.suptitle(f"allocated device memory through one step, {where}", fontsize=10)
    figure.tight_layout()
    overlay.set_xlabel(label)
    overlay.set_ylabel("allocated GB")
    overlay.set_title(f"allocated device memory through one step, {where}", fontsize=10)
    overlay.grid(True, alpha=0.3)
    overlay.legend()
    overlay_figure.tight_layout()
    paths = [out / "memory_timeline.png", out / "memory_timeline_overlay.png"]
    figure.savefig(paths[0], dpi=110)
    overlay_figure.savefig(paths[1], dpi=110)
    plt.close(figure)
    plt.close(overlay_figure)
    return paths


if __name__ == "__main__":
    main()
