#!/usr/bin/env python3
r"""Gradients of each mode under FSDP2 on several GPUs against FSDP2 + torch's checkpointing.

Launched with torchrun, one process per GPU (NCCL). The Llama --shape (default the reference) with
--layers decoder layers, fully_shard per layer and root (bench_fsdp2.build_sharded, every variant
initialised from the same seed; --lora: PEFT LoRA r 16 on every projection, the base frozen, so the
gradients are the adapters'), one forward+backward at --seq tokens per rank (different tokens on
each rank). Per variant (--variants; bench_fsdp2's names) and dtype (--dtypes), on this rank's
shards: the loss and every parameter gradient against the checkpointing run.
- fp32 (on CUDA SDPA's math kernel, deterministic): hs_before, hs_after and all must be bit-equal;
  the variants that sum in another order, hs_chunked, ckpt_chunked (the loss over chunks) and
  lc_after (the chunked loss and the tiled MLP and norms), within rtol 1e-5 / atol 1e-6.
- bf16 (default SDPA kernels): relative L2 error of all gradients against checkpointing, beside the
  noise floor: the largest error against checkpointing of the --floor runs (ckpt: checkpointing
  again; none: plain FSDP2 without checkpointing; ckpt_chunked: checkpointing with the loss summed
  over chunks, the same loss in another order). A floor run that runs out of memory is recorded
  and left out. Requirement: error <= 2 x the floor (1e-3 where the floor is 0).
Rank 0 writes <out>/fsdp2_gradients_<gpu>x<N>.json (without --out, into a new temporary folder) and
prints each check; exit 1 when a check fails.

GPU:  torchrun --nproc_per_node=2 benchmarks/fsdp2_gradients.py --out DIR
LoRA on the 8B shape, 4 layers, 64K tokens per rank (2x H200, about 2 minutes):
    torchrun --standalone --nproc_per_node=2 benchmarks/fsdp2_gradients.py --lora --shape llama3_8b \
        --layers 4 --seq 65536 --dtypes bf16 --variants lc_after --floor ckpt,ckpt_chunked --out DIR
  bf16 only: fp32's math attention would hold a 64K x 64K score matrix per head. The floor without
  none: plain FSDP2 keeps every activation of the 4 layers and the fp32 logits (~180 GB per rank,
  more than an H200). Estimate: one forward+backward of 4 of the 32 layers at 64K (~1/8 of the
  ~18 s step, plus the LM head over 128K vocabulary) ~3-5 s, a build ~5-10 s; 4 runs (ckpt, ckpt
  again, ckpt_chunked, lc_after): ~1 minute, ~2 with start-up.
CPU:  torchrun --nproc_per_node=2 benchmarks/fsdp2_gradients.py --device cpu --tiny --out DIR (fp32 only)
      ... --device cpu --tiny --lora --variants ckpt_chunked,lc_after
"""
import argparse
import contextlib
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_fsdp2 import CHUNKED, build_sharded  # noqa: E402
from benchmarks.common import (SHAPES, TINY, add_out_arg, new_result, output_dir, release_memory,  # noqa: E402
                               short_gpu_name)

VARIANTS = ("hs_before", "hs_after", "all", "hs_chunked", "ckpt_chunked", "lc_after")
FLOOR = ("ckpt", "none", "ckpt_chunked")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def gradients(args, shape, variant, dtype):
    """(loss, {name: local gradient shard}) of one step of `variant`."""
    args.dtype = dtype
    torch.manual_seed(1234)  # same parameters in every variant
    model, handle = build_sharded(args, shape, args.seq, variant)
    torch.manual_seed(99 + dist.get_rank())
    ids = torch.randint(0, shape["vocab"], (1, args.seq), device=args.device)
    exact = dtype == torch.float32 and args.device == "cuda"
    with sdpa_kernel(SDPBackend.MATH) if exact else contextlib.nullcontext():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = {n: p.grad.to_local().detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    if handle is not None:
        handle.remove()
    del model, handle
    release_memory(args.device)
    return loss.detach().float(), grads


def floor_gradients(args, shape, variant, dtype):
    """gradients() of a floor run, or None where it ran out of memory on any rank."""
    try:
        result = gradients(args, shape, variant, dtype)
    except torch.OutOfMemoryError:
        result = None
        release_memory(args.device)
    return result if all_ranks(result is not None, args.device) else None


def relative_error(a, b):
    num = sum(((a[n] - b[n]) ** 2).sum() for n in a)
    den = sum((b[n] ** 2).sum() for n in b)
    both = torch.stack([num, den])
    dist.all_reduce(both)  # over every rank's shards
    return (both[0] / both[1]).sqrt().item()


def all_ranks(ok: bool, device) -> bool:
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--shape", default="reference", choices=sorted(SHAPES))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)  # two chunks of the chunked loss
    p.add_argument("--lora", action="store_true", help="PEFT LoRA (r 16) on every projection, the base frozen")
    p.add_argument("--variants", default=",".join(VARIANTS[:4]), help="checked against ckpt: " + ",".join(VARIANTS))
    p.add_argument("--floor", default="ckpt,none", help="bf16 noise floor runs: " + ",".join(FLOOR))
    p.add_argument("--dtypes", default=None, help="fp32,bf16 (default: both on CUDA, fp32 on CPU)")
    add_out_arg(p)
    args = p.parse_args()
    args.cpu_offload = False
    variants, floor_runs = args.variants.split(","), args.floor.split(",")
    for given, known, flag in ((variants, VARIANTS, "--variants"), (floor_runs, FLOOR, "--floor")):
        if any(v not in known for v in given):
            p.error(f"{flag} {','.join(given)}: choose from {','.join(known)}")
    dtype_names = (args.dtypes or ("fp32,bf16" if args.device == "cuda" else "fp32")).split(",")
    if any(d not in DTYPES for d in dtype_names):
        p.error(f"--dtypes {args.dtypes}: choose from {','.join(DTYPES)}")
    shape = dict(TINY if args.tiny else SHAPES[args.shape], layers=args.layers)
    if args.tiny:
        args.seq = min(args.seq, 64)
    args.config = shape
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", timeout=datetime.timedelta(seconds=300))
    result = new_result(args, world_size=dist.get_world_size(), checks=[], floor={})
    failed = False
    for dtype in (DTYPES[d] for d in dtype_names):
        ref_loss, ref = gradients(args, shape, "ckpt", dtype)
        done = {}  # floor runs that are also checked variants run once
        if dtype == torch.bfloat16:
            errors = {}
            for variant in floor_runs:
                done[variant] = floor_gradients(args, shape, variant, dtype)
                errors[variant] = "OOM" if done[variant] is None else relative_error(done[variant][1], ref)
            result["floor"] = errors
            measured = [e for e in errors.values() if e != "OOM"]
            floor = max(measured) if measured else 0.0
            if dist.get_rank() == 0:
                print(json.dumps({"noise_floor_runs": errors}), flush=True)
        for variant in variants:
            reused = done.get(variant) if variant != "ckpt" else None
            loss, grads = reused if reused is not None else gradients(args, shape, variant, dtype)
            check = {"dtype": str(dtype).removeprefix("torch."), "variant": variant, "lora": args.lora,
                     "seq": args.seq, "loss": loss.item(), "ckpt_loss": ref_loss.item(),
                     "relative_error": relative_error(grads, ref)}
            if dtype == torch.float32 and variant not in CHUNKED:
                check["requirement"] = "bit-equal"
                ok = torch.equal(loss, ref_loss) and all(torch.equal(grads[n], ref[n]) for n in ref)
            elif dtype == torch.float32:
                check["requirement"] = "rtol 1e-5, atol 1e-6"
                ok = torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-6) and all(
                    torch.allclose(grads[n], ref[n], rtol=1e-5, atol=1e-6) for n in ref)
            else:
                check["noise_floor"] = floor
                check["requirement"] = "relative error <= max(2 x noise floor, 1e-3 if the floor is 0)"
                ok = check["relative_error"] <= (2 * floor if floor > 0 else 1e-3)
            check["ok"] = all_ranks(ok, args.device)
            failed |= not check["ok"]
            result["checks"].append(check)
            if dist.get_rank() == 0:
                print(json.dumps(check), flush=True)
    if dist.get_rank() == 0:
        out = output_dir(args, prefix="torch_offload_fsdp2_gradients_")
        name = f"fsdp2_gradients_{short_gpu_name(args.device)}x{dist.get_world_size()}.json"
        (out / name).write_text(json.dumps(result, indent=1, default=str))
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
