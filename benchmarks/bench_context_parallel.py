#!/usr/bin/env python3
r"""One sequence split over the GPUs: FSDP2 + torch's context parallelism (ring attention) + torch_offload.

Launched with torchrun, one process per GPU (NCCL). No communication of our own: the sequence is
sharded by torch.distributed.tensor.experimental.context_parallel, attention is torch's ring
attention (SDPA flash / efficient / cuDNN kernels, patched in by context_parallel), the parameters
are sharded by FSDP2 (fully_shard on every decoder layer and the root). torch_offload only offloads
each rank's local shard of the checkpoint boundaries.

Model: LlamaForCausalLM of the Llama-3-8B shape (--layers N: the first N decoder layers; --tiny: a
small shape for CPU smoke runs), bf16 on CUDA (fp32 on CPU), every parameter trained (no LoRA),
built on the meta device, sharded, then materialised (no rank ever holds the whole model).

Mesh: one dimension over all ranks ("cp"); FSDP2 shards the parameters over it and context
parallelism splits the sequence over it (torchtitan's dp_shard=1, cp=N layout). Every rank holds the
same token sequence (same seed); context_parallel shards input_ids, position_ids and shift_labels on
dim 1 with torch's head-tail load balancing (rank r holds chunks r and 2N-1-r of 2N): the sequence
length must be a multiple of 2N.

How the Hugging Face model is called under CP (the constraints, see also the summary below):
- attention mask: SDPA must get attn_mask=None and is_causal=True (ring attention refuses a mask:
  context_parallel wraps every tensor argument of SDPA as a sequence-sharded DTensor, and the efficient
  kernel's ring version raises for attn_bias). The load-balanced position_ids are not 0..S-1, so
  transformers would detect "packed sequences" from them and build a dense mask (S/N x S/N per
  rank). The model therefore runs under an attention implementation registered here
  (ATTENTION = "torch_offload_cp_sdpa": transformers' own sdpa_attention_forward, and no mask
  function registered under that name, so create_causal_mask returns None before looking at
  position_ids); sdpa_attention_forward then passes is_causal=True. position_ids still reach the
  rotary embedding, so each token is rotated by its global position.
- labels: the loss must not shift the local shard (it would pair tokens across the chunk borders),
  so the labels are shifted once over the whole sequence (last = -100) and passed as shift_labels
  (and as labels, which LlamaForCausalLM needs to compute a loss at all; ForCausalLMLoss and our
  chunked loss ignore labels when shift_labels is given).
- loss averaging: FSDP2 averages gradients over the mesh (divides the sum by N). Each rank's loss is
  its local sum divided by num_items_in_batch = (valid tokens of the whole sequence) / N, so the
  averaged gradient is exactly the gradient of the global mean loss (the rank holding the last token
  has one valid token fewer: a plain local mean would be off by about N/S). The loss reported is the
  sum of the ranks' losses / N = the global mean.
- GQA: transformers calls SDPA with enable_gqa=True (8 KV heads for 32 query heads); SDPA then picks
  the flash kernel (the efficient one has no GQA), and the ring passes K/V with 8 heads. --repeat-kv
  repeats K/V to 32 heads before SDPA instead (4x the ring traffic) if that fails.

Variants:
  plain          no checkpointing (check-grads only)
  ckpt           FSDP2 + CP + torch gradient checkpointing (HF gradient_checkpointing_enable,
                 non-reentrant), the model's own loss (full logits): the baseline
  ckpt_chunked   ckpt + our chunked loss only (torch_offload.chunk_lm_loss): what the loss alone gives
  ours           torch_offload.apply(model, "hidden_states", long_context=True) BEFORE fully_shard
                 (docs/guides/fsdp2.md): boundaries to host, chunked loss, tiled MLP and norms; with
                 every parameter trained there are no frozen weights, so layer offloading stays off
                 by itself (it refuses FSDP2's DTensor parameters anyway)
  ours_no_tiles  torch_offload.apply(model, "hidden_states", chunked_loss=True) before fully_shard
Optimizer: --optimizer adamw (default; bf16 states, created at the first step(): a single step's peak
during backward has no states yet), sgd (no state) or none (backward only).

Modes (run in this order, results written after every run):
  --check-grads SEQ  CP (FSDP2 over all ranks) against the same model on ONE rank without CP, at SEQ
                     tokens on --check-layers layers: loss and relative L2 error of all gradients
                     against a one-rank fp32 reference, beside the bf16 noise floor (one rank, bf16,
                     against the same fp32 reference). Criterion (as fsdp2_gradients.py): CP's error
                     <= 2 x the floor. On CPU (fp32) the CP run must match the reference to ~1e-5.
  --longest          the longest total sequence (all ranks together) that trains one step, for each of
                     --longest-variants (default ckpt), fresh model per try, OOM outcome agreed over
                     ranks (benchmarks/common.py longest_fitting), bounded by --longest-budget-s.
  --seqs             timed runs (--warmup, --steps) of --variants at each total length.
--deadline-s: no run starts after it (all ranks agree); what was skipped is recorded.
--snapshot (CUDA): after each timed run's measured steps, one more step under CUDA's allocation
history; each rank's row holds what is live at that step's forward and backward (the optimizer's
step included) peaks (benchmarks/peak_memory.py's analyse), by class and by allocating line.

Rank 0 writes <out>/context_parallel_<gpu>x<N>.json and .md, and a .png of the timed runs (peak memory of
the fuller rank and tokens/s against the total length, one line per variant; needs matplotlib).

CPU smoke (no GPU): there is no ring attention on CPU (its kernels are CUDA ones), so --device cpu
emulates context parallelism: the same context_parallel buffer sharding and load balancing, the
same model calls, but attention all-gathers K/V with a test-only autograd function (not used on
CUDA) and masks by global position. This checks everything around the ring attention (position_ids,
the mask path, shift_labels, loss scaling, FSDP2 averaging, offload of the local shard):
  torchrun --nproc_per_node=2 benchmarks/bench_context_parallel.py --device cpu --tiny \
      --check-grads 64 --longest --seqs 64,128 --out DIR
Measured (docs/performance.md, long context): on 2 x H100, torch's ring attention under
context_parallel with the flash kernel and enable_gqa, FSDP2 over the same ranks, the gradient check
(CP within the bf16 noise floor of one rank) and one step of ours at 524288 tokens on 8 of the 32
layers:
  torchrun --nproc_per_node=2 benchmarks/bench_context_parallel.py --layers 8 --check-grads 8192 \
      --check-layers 2 --check-variants ckpt,ours --seqs 524288 --variants ours --warmup 0 --steps 1 \
      --timeout-s 200 --out DIR
On 4 x H100, all 32 layers: one step of ours at 524288 tokens, and the longest length ckpt fits:
  torchrun --nproc_per_node=4 benchmarks/bench_context_parallel.py --seqs 524288 --variants ours \
      --warmup 0 --steps 1 --timeout-s 360 --out DIR
  torchrun --nproc_per_node=4 benchmarks/bench_context_parallel.py --longest --longest-variants ckpt \
      --longest-start 65536 --longest-step 32768 --longest-max 524288 --longest-budget-s 162 \
      --seqs "" --timeout-s 120 --out DIR
"""
import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from benchmarks.common import (GB, LLAMA3_8B, TINY, add_run_args, agree, build_llama, exit_without_finalising,  # noqa: E402
                               gather, init_ranks, log, longest_fitting, new_result, output_dir, past_deadline,
                               release_memory, short_gpu_name, table, timed_steps, worst_rank)
from benchmarks.peak_memory import mark_backward, snapshot_row  # noqa: E402

VARIANTS = ("plain", "ckpt", "ckpt_chunked", "ours", "ours_no_tiles")
ATTENTION = "torch_offload_cp_sdpa"
_SDPA = F.scaled_dot_product_attention  # the unpatched function (context_parallel replaces F's attribute)


class _Emulation:
    """CPU only: context parallelism emulated in attention (all-gathered K/V), for smoke tests."""

    on = False
    group = None
    repeat_kv = False


class _GatherSeq(torch.autograd.Function):
    """Test-only (CPU emulation): all-gather on dim 2; backward sums the gradient over ranks and
    keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x)
        ctx.size = x.shape[2]
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        rank = dist.get_rank()
        return grad[:, :, rank * ctx.size:(rank + 1) * ctx.size]


def _cp_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention without a mask (is_causal=True); ring attention comes from
    context_parallel's patch of F.scaled_dot_product_attention. On CPU, the emulation."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if _Emulation.on:
        positions = kwargs["position_ids"].reshape(-1)
        every = _GatherSeq.apply(positions.view(1, 1, -1, 1).float()).reshape(-1)
        key, value = repeat_kv(_GatherSeq.apply(key), groups), repeat_kv(_GatherSeq.apply(value), groups)
        mask = every.view(1, -1) <= positions.view(-1, 1).float()
        out = _SDPA(query, key, value, attn_mask=mask, scale=kwargs.get("scaling"))
        return out.transpose(1, 2).contiguous(), None
    if _Emulation.repeat_kv and groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    if attention_mask is not None:
        raise RuntimeError("bench_context_parallel: the model built an attention mask; ring attention needs none")
    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


def register_attention() -> None:
    # Only the attention function: with no mask function under this name, transformers'
    # create_causal_mask returns None at once (no packed-sequence detection from position_ids).
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _cp_attention)


# ------------------------------------------------------------------------------------------------
# model


def build(args, shape: dict, variant: str, dtype, mesh=None, full_state=None, seed=0):
    """(model, handle): `variant` applied, fully_shard per layer and root over `mesh` (None: one rank,
    no FSDP); parameters from `full_state` (a full fp32 state dict, the same on every rank) or random."""
    model = build_llama(shape, "meta", 8192, dtype=dtype, attn_implementation=ATTENTION)
    handle = None
    if variant in ("ckpt", "ckpt_chunked"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if variant == "ckpt_chunked":
        handle = torch_offload.chunk_lm_loss(model)
    elif variant == "ours":
        handle = torch_offload.apply(model, "hidden_states", long_context=True)
    elif variant == "ours_no_tiles":
        handle = torch_offload.apply(model, "hidden_states", chunked_loss=True)
    if mesh is not None:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    model.to_empty(device=args.device)
    generator = torch.Generator(device=args.device).manual_seed(seed + (dist.get_rank() if full_state is None else 0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if full_state is not None:
                full = full_state[name].to(args.device, dtype)
                if hasattr(p, "to_local"):
                    from torch.distributed.tensor import distribute_tensor

                    full = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                local.copy_(full)
            elif "norm" in name:
                local.fill_(1.0)
            else:
                local.normal_(0.0, 0.02, generator=generator)
        with torch.device(args.device):  # the rotary buffers, rebuilt on the device
            model.model.rotary_emb = type(model.model.rotary_emb)(model.config)
    return model, handle


def full_state_dict(shape: dict, seed: int) -> dict:
    """A full fp32 state dict on CPU, the same on every rank (the check's one set of weights)."""
    names = [(n, p.shape) for n, p in build_llama(shape, "meta", 8192, attn_implementation=ATTENTION).named_parameters()]
    generator = torch.Generator().manual_seed(seed)
    return {n: (torch.ones(s) if "norm" in n else torch.empty(s).normal_(0.0, 0.02, generator=generator))
            for n, s in names}


def sequence(args, shape: dict, seq: int, seed: int):
    """(input_ids, position_ids, shift_labels, valid tokens), the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, shape["vocab"], (1, seq), generator=generator).to(args.device)
    positions = torch.arange(seq, device=args.device).unsqueeze(0)
    shift_labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100, device=args.device, dtype=ids.dtype)], dim=1)
    return ids, positions, shift_labels, seq - 1


def sdpa_context(args, dtype):
    if args.device != "cuda" or args.sdpa == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if dtype == torch.float32:  # no fp32 flash kernel
        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION}[args.sdpa])


def cp_step(args, model, mesh, tokens, dtype, optimizer=None, marks=None):
    """One training step of the whole sequence, split over `mesh`: returns the global mean loss.
    marks: record_step's (--snapshot)."""
    ids, positions, shift_labels, valid = (t.clone() if torch.is_tensor(t) else t for t in tokens)
    world = mesh.size()
    if args.device == "cuda":
        from torch.distributed.tensor.experimental import context_parallel

        shard = context_parallel(mesh, buffers=[ids, positions, shift_labels], buffer_seq_dims=[1, 1, 1],
                                 no_restore_buffers={ids, positions, shift_labels})
    else:
        shard = emulated_context_parallel(mesh, [ids, positions, shift_labels])
    with shard, sdpa_context(args, dtype):
        loss = model(input_ids=ids, position_ids=positions, labels=shift_labels, shift_labels=shift_labels,
                     num_items_in_batch=valid / world).loss
        mark_backward(marks)
        loss.backward()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    total = loss.detach().float().clone()
    dist.all_reduce(total)
    return total / world


@contextlib.contextmanager
def emulated_context_parallel(mesh, buffers):
    """CPU: torch's buffer sharding and load balancing (as context_parallel does them), attention
    emulated (_Emulation) instead of torch's CUDA ring attention."""
    from torch.distributed.tensor.experimental._context_parallel._attention import _context_parallel_buffers
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _create_default_load_balancer

    balancer = _create_default_load_balancer(buffers[0].shape[1], mesh.size(), buffers[0].device)
    for buffer, shard in zip(buffers, _context_parallel_buffers(mesh, buffers, [1] * len(buffers), balancer)):
        shard = shard.clone()
        buffer.resize_(shard.shape)
        buffer.copy_(shard)
    _Emulation.on = True
    try:
        yield
    finally:
        _Emulation.on = False


def restore_sdpa() -> None:
    """After an exception inside context_parallel (its generator has no finally): torch's SDPA and
    DTensor dispatch back as they were."""
    _Emulation.on = False
    if F.scaled_dot_product_attention is not _SDPA:
        from torch.distributed.tensor.experimental._context_parallel._attention import (
            _disable_context_parallel_dispatcher_impl)

        _disable_context_parallel_dispatcher_impl()


def make_optimizer(args, model):
    if args.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-5)
    return None


# ------------------------------------------------------------------------------------------------
# timed runs and the longest sequence


def run(args, mesh, shape: dict, seq: int, variant: str, warmup: int, steps: int) -> dict:
    """One variant at one total length on this rank: timings, memory, bytes moved; or {"error": ...}."""
    row = {"variant": variant, "seq": seq, "local_seq": seq // mesh.size(), "rank": dist.get_rank()}
    model = handle = optimizer = None
    try:
        if seq % (2 * mesh.size()):
            raise ValueError(f"{seq} tokens: not a multiple of 2 x {mesh.size()} ranks (load balancing)")
        model, handle = build(args, shape, variant, args.dtype, mesh=mesh)
        optimizer = make_optimizer(args, model)
        tokens = sequence(args, shape, seq, args.seed)
        losses = []

        def step():
            losses.append(cp_step(args, model, mesh, tokens, args.dtype, optimizer).item())

        for _ in range(warmup):
            step()
        if handle is not None and hasattr(handle, "manager") and handle.manager is not None:
            handle.manager.synchronize()
            handle.manager.reset_stats()
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row.update(timed_steps(step, steps, seq, args.device))
        row["losses"] = losses
        if handle is not None and hasattr(handle, "manager") and handle.manager is not None:
            stats = handle.stats()
            row["GB_to_host_per_step"] = stats["bytes_to_host"] / steps / GB
            row["stats"] = stats
            if handle.notes:  # long_context: what it turned on and why
                row["explain"] = handle.explain()
        if args.snapshot:
            block_input_bytes = row["local_seq"] * shape["hidden"] * torch.finfo(args.dtype).bits // 8
            row["snapshot"] = snapshot_row(
                lambda marks: cp_step(args, model, mesh, tokens, args.dtype, optimizer, marks), block_input_bytes)
    except torch.OutOfMemoryError:
        row["error"] = "OOM"
        restore_sdpa()
    except Exception as error:  # recorded (and agreed over ranks) instead of hanging the others
        row["error"] = f"{type(error).__name__}: {error}"[:2000]
        log(f"rank {dist.get_rank()} {variant}@{seq}: {row['error']}")
        restore_sdpa()
    finally:
        if handle is not None:
            if hasattr(handle, "manager") and handle.manager is not None:
                handle.manager.empty_pool()
            handle.remove()
        model = handle = optimizer = step = None
        release_memory(args.device)
    return row


def summarise(rows: list, shape: dict, elem_bytes: int) -> dict:
    first = rows[0]
    out = {"variant": first["variant"], "seq": first["seq"], "local_seq": first["local_seq"], "per_rank": rows}
    errors = sorted({r["error"] for r in rows if "error" in r})
    if errors:
        out["error"] = " | ".join(errors)
        return out
    out.update(worst_rank(rows))
    out["loss"] = first["losses"][-1]
    out["tokens_per_s"] = first["seq"] / out["step_s"]
    out["boundary_GB_per_rank"] = shape["layers"] * first["local_seq"] * shape["hidden"] * elem_bytes / GB
    return out


def longest(args, mesh, shape: dict, variant: str, result: dict) -> int:
    started = time.monotonic()

    def fits(seq):
        if past_deadline(args) or (args.longest_budget_s > 0 and not agree(
                args, time.monotonic() - started < args.longest_budget_s)):
            raise TimeoutError(f"time limit reached in the longest search of {variant} (before {seq})")
        row = run(args, mesh, shape, seq, variant, warmup=0, steps=1)
        ok = agree(args, "error" not in row)
        rows = gather(row)
        if rows is not None:
            result["longest_tries"].append({"variant": variant, "seq": seq, "fits": ok,
                                            "errors": sorted({r["error"][:200] for r in rows if "error" in r}),
                                            "peaks_GB": [r.get("peak_allocated_GB") for r in rows],
                                            "step_s": rows[0].get("step_s")})
            log(f"longest {variant}: {seq} {'fits' if ok else 'does not fit'}")
        return ok

    try:
        return longest_fitting(fits, args.longest_start, args.longest_step, args.longest_max)
    except TimeoutError as error:
        result.setdefault("skipped", []).append(str(error))
        tried = [t["seq"] for t in result["longest_tries"] if t["variant"] == variant and t["fits"]]
        return max(tried, default=0)


# ------------------------------------------------------------------------------------------------
# gradients: context parallel against one rank


def check_grads(args, mesh, shape: dict, result: dict) -> dict:
    """CP (bf16 on CUDA) against one rank without CP, both against a one-rank fp32 reference."""
    seq, rank = args.check_grads, dist.get_rank()
    full = full_state_dict(shape, args.seed)
    tokens = sequence(args, shape, seq, args.seed + 1)
    ids, positions, shift_labels, valid = tokens
    low = args.dtype  # bf16 on CUDA, fp32 on CPU
    out = {"seq": seq, "layers": shape["layers"], "dtype": str(low)}

    def one_rank(dtype, variant="plain"):
        model, handle = build(args, shape, variant, dtype, full_state=full)
        with sdpa_context(args, dtype):
            loss = model(input_ids=ids, labels=shift_labels, shift_labels=shift_labels).loss
            loss.backward()
        grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()}
        if handle is not None:
            handle.remove()
        del model
        release_memory(args.device)
        return loss.item(), grads

    def cp(variant, dtype):
        model, handle = build(args, shape, variant, dtype, mesh=mesh, full_state=full)
        loss = cp_step(args, model, mesh, tokens, dtype).item()
        grads = {n: p.grad.full_tensor().detach().float().cpu() for n, p in model.named_parameters()}
        if handle is not None:
            handle.remove()
        del model
        release_memory(args.device)
        return loss, grads

    def error(a, b):
        num = sum(float(((a[n] - b[n]) ** 2).sum()) for n in b)
        return math.sqrt(num / sum(float((b[n] ** 2).sum()) for n in b))

    reference = noise = None
    if rank == 0:  # the one-rank runs (no collective inside)
        reference = one_rank(torch.float32)
        out["loss_fp32_one_rank"] = reference[0]
        if low != torch.float32:
            noise = one_rank(low)
            out["loss_bf16_one_rank"] = noise[0]
            out["noise_floor"] = error(noise[1], reference[1])
    dist.barrier()
    out["cp"] = {}
    for variant in args.check_variants.split(","):
        row = {}
        try:
            loss, grads = cp(variant, low)
        except Exception as error_:
            row["error"] = f"{type(error_).__name__}: {error_}"[:2000]
            log(f"rank {rank} check {variant}: {row['error']}")
            loss = grads = None
        if agree(args, grads is not None) and rank == 0:
            row["loss"] = loss
            row["loss_diff_vs_fp32"] = abs(loss - reference[0])
            row["grad_rel_error_vs_fp32"] = error(grads, reference[1])
            if noise is not None:
                row["grad_rel_error_vs_bf16_one_rank"] = error(grads, noise[1])
                floor = out["noise_floor"]
                row["within_noise"] = row["grad_rel_error_vs_fp32"] <= max(2 * floor, 1e-3 if floor == 0 else 0)
            else:  # fp32 (CPU emulation): must match the reference to rounding
                row["within_noise"] = row["grad_rel_error_vs_fp32"] <= 1e-4
        out["cp"][variant] = row
        if rank == 0:
            log(f"check-grads {variant}: {json.dumps(row)}")
        dist.barrier()
    if rank == 0:
        log(f"check-grads: {json.dumps({k: v for k, v in out.items() if k != 'cp'})}")
    return out


# ------------------------------------------------------------------------------------------------
# output


def markdown(result: dict) -> str:
    lines = [f"# Context parallel + FSDP2, {result['world_size']} ranks on {result['gpu']}", "",
             f"command: `{result['command']}`", "",
             "One sequence split over all ranks (seq = total tokens); memory per rank, worst rank shown; "
             "boundary = L*(S/N)*h*elem per rank.", ""]
    check = result.get("check_grads")
    if check:
        lines += [f"## Gradients: CP vs one rank, {check['seq']} tokens, {check['layers']} layers, {check['dtype']}", ""]
        if "noise_floor" in check:
            lines += [f"noise floor (one rank bf16 vs one rank fp32): {check['noise_floor']:.3g}", ""]
        for variant, row in check["cp"].items():
            lines.append(f"- {variant}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                     for k, v in row.items()))
        lines.append("")
    if result.get("longest"):
        lines += ["## Longest total sequence (one step)", ""] + [f"- {v}: {s}" for v, s in result["longest"].items()]
        lines += [""] + table(result.get("longest_tries", []), [
            ("fits", "fits", "{}"), ("step s", "step_s", "{:.2f}")]) + [""]
    lines += ["## Timed", ""] + table(result["runs"], [
        ("local seq", "local_seq", "{}"), ("step s", "step_s", "{:.2f}"), ("tok/s", "tokens_per_s", "{:.0f}"),
        ("loss", "loss", "{:.4f}"), ("peak alloc GB", "peak_allocated_GB", "{:.2f}"),
        ("peak reserved GB", "peak_reserved_GB", "{:.2f}"), ("boundary GB/rank", "boundary_GB_per_rank", "{:.2f}"),
        ("to host GB/step", "GB_to_host_per_step", "{:.2f}")])
    return "\n".join(lines) + "\n"


def plot_runs(result: dict, path: Path) -> None:
    """Peak memory (the fuller rank's) and tokens/s against the total length, one line per variant."""
    from torch_offload.bench.plot import plot

    c = result["config"]
    figure = dict(result, model=f"{c['layers']}-layer, {result['world_size']} ranks (FSDP2 + context parallel)",
                  steps=None)
    try:
        plot(figure, path)
    except RuntimeError as error:  # matplotlib missing: the JSON can be plotted elsewhere
        log(error)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, seqs="", steps=1, warmup=0)
    p.add_argument("--layers", type=int, default=0, help="decoder layers (default: all of the shape)")
    p.add_argument("--variants", default="ours", help="timed variants, comma-separated: " + ",".join(VARIANTS))
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd", "none"))
    p.add_argument("--sdpa", default="flash", choices=("flash", "efficient", "cudnn", "auto"),
                   help="SDPA kernel forced around forward+backward (bf16; fp32 uses efficient/math)")
    p.add_argument("--repeat-kv", action="store_true", help="repeat K/V to all heads before SDPA (no enable_gqa)")
    p.add_argument("--rotate", default="allgather", choices=("allgather", "alltoall"),
                   help="torch's K/V rotation (set_rotate_method)")
    p.add_argument("--check-grads", type=int, default=0, metavar="SEQ", help="CP vs one rank at SEQ tokens")
    p.add_argument("--check-layers", type=int, default=2)
    p.add_argument("--check-variants", default="ckpt,ours")
    p.add_argument("--longest", action="store_true")
    p.add_argument("--longest-variants", default="ckpt")
    p.add_argument("--longest-start", type=int, default=32768)
    p.add_argument("--longest-step", type=int, default=8192)
    p.add_argument("--longest-max", type=int, default=262144)
    p.add_argument("--longest-budget-s", type=float, default=0.0, help="per variant (0: none)")
    p.add_argument("--deadline-s", type=float, default=0.0, help="start no run after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=int, default=900, help="collective timeout")
    p.add_argument("--snapshot", action="store_true",
                   help="CUDA: after each timed run's measured steps, one more step under CUDA's allocation history; "
                        "each rank's row holds what is live at that step's forward and backward peaks")
    args = p.parse_args()
    if args.snapshot and args.device != "cuda":
        p.error("--snapshot records CUDA's allocation history: run it with --device cuda")
    args.config = dict(TINY if args.tiny else LLAMA3_8B)
    if args.layers:
        args.config["layers"] = args.layers
    args.seq_list = [int(s) for s in args.seqs.split(",") if s]
    if args.tiny and "--longest-start" not in sys.argv:
        args.longest_start, args.longest_step, args.longest_max = 64, 32, 256
    for name in args.variants.split(",") + args.check_variants.split(",") + args.longest_variants.split(","):
        if name and name not in VARIANTS:
            p.error(f"unknown variant {name!r}; choose from {VARIANTS}")
    args.start = time.monotonic()
    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    elem_bytes = torch.tensor([], dtype=args.dtype).element_size()
    _Emulation.repeat_kv = args.repeat_kv

    rank, world = init_ranks(args)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(args.device, (world,), mesh_dim_names=("cp",))
    register_attention()
    if args.device == "cuda":
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        set_rotate_method(args.rotate)
    result = new_result(args, world_size=world, longest_tries=[], optimizer=args.optimizer, sdpa=args.sdpa,
                        repeat_kv=args.repeat_kv, rotate=args.rotate)
    out = output_dir(args, prefix="torch_offload_cp_") if rank == 0 else None
    stem = f"context_parallel_{short_gpu_name(args.device)}x{world}" + ("_tiny" if args.tiny else "")

    def save():
        if rank == 0:
            (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
            (out / f"{stem}.md").write_text(markdown(result))

    if args.check_grads:
        shape = dict(args.config, layers=min(args.check_layers, args.config["layers"]))
        result["check_grads"] = check_grads(args, mesh, shape, result)
        save()
    if args.longest:
        result["longest"] = {}
        for variant in args.longest_variants.split(","):
            result["longest"][variant] = longest(args, mesh, args.config, variant, result)
            save()
    for seq in args.seq_list:
        for variant in args.variants.split(","):
            if past_deadline(args):
                result.setdefault("skipped", []).append(f"{variant}@{seq}")
                continue
            rows = gather(run(args, mesh, args.config, seq, variant, args.warmup, args.steps))
            if rows is not None:
                result["runs"].append(summarise(rows, args.config, elem_bytes))
                log(f"{seq} {variant}: " + json.dumps({k: v for k, v in result["runs"][-1].items()
                                                       if k not in ("per_rank",)}, default=str)[:3000])
                save()
    save()
    if rank == 0:
        log(markdown(result))
        if result["runs"]:
            plot_runs(result, out / f"{stem}.png")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_finalising()
