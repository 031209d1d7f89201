#!/usr/bin/env python3
"""Gradients of each mode under FSDP2 on several GPUs against FSDP2 + torch's checkpointing.

Launched with torchrun, one process per GPU (NCCL). The reference Llama shape with --layers decoder
layers, fully_shard per layer and root (bench_fsdp2.build_sharded, every variant initialised from
the same seed), one forward+backward at --seq tokens per rank (different tokens on each rank).
Per variant and dtype, on this rank's shards: the loss and every parameter gradient against the
checkpointing run.
- fp32 (SDPA's math kernel, deterministic): hs_before, hs_after and all must be bit-equal;
  hs_chunked (loss summed over chunks) within rtol 1e-5 / atol 1e-6.
- bf16 (default SDPA kernels): relative L2 error of all gradients against checkpointing, beside the
  noise floor = checkpointing against itself and against plain FSDP2 without checkpointing.
Rank 0 writes <out>/fsdp2_gradients_<gpu>x<N>.json (without --out, into a new temporary folder) and
prints each check; exit 1 when a check fails.

GPU:  torchrun --nproc_per_node=2 benchmarks/fsdp2_gradients.py --out DIR
CPU:  torchrun --nproc_per_node=2 benchmarks/fsdp2_gradients.py --device cpu --tiny --out DIR (fp32 only)
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
from benchmarks.bench_fsdp2 import build_sharded  # noqa: E402
from benchmarks.common import REFERENCE, TINY, add_out_arg, new_result, output_dir, short_gpu_name  # noqa: E402

VARIANTS = ("none", "ckpt", "hs_before", "hs_after", "all", "hs_chunked")


def gradients(args, shape, variant, dtype):
    """(loss, {name: local gradient shard}) of one step of `variant`."""
    args.dtype = dtype
    torch.manual_seed(1234)  # same parameters in every variant
    model, handle = build_sharded(args, shape, args.seq, "none" if variant == "none" else variant)
    torch.manual_seed(99 + dist.get_rank())
    ids = torch.randint(0, shape["vocab"], (1, args.seq), device=args.device)
    exact = dtype == torch.float32 and args.device == "cuda"
    with sdpa_kernel(SDPBackend.MATH) if exact else contextlib.nullcontext():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = {n: p.grad.to_local().detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    if handle is not None:
        handle.remove()
    del model
    return loss.detach().float(), grads


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
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)  # two chunks of the chunked loss
    add_out_arg(p)
    args = p.parse_args()
    shape = dict(TINY if args.tiny else REFERENCE, layers=args.layers)
    if args.tiny:
        args.seq = min(args.seq, 64)
    args.config = shape
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", timeout=datetime.timedelta(seconds=300))
    result = new_result(args, world_size=dist.get_world_size(), checks=[])
    dtypes = [torch.float32] + ([torch.bfloat16] if args.device == "cuda" else [])
    failed = False
    for dtype in dtypes:
        ref_loss, ref = gradients(args, shape, "ckpt", dtype)
        if dtype == torch.bfloat16:
            _, again = gradients(args, shape, "ckpt", dtype)
            _, plain = gradients(args, shape, "none", dtype)
            floor = max(relative_error(again, ref), relative_error(plain, ref))
        for variant in VARIANTS[2:]:
            loss, grads = gradients(args, shape, variant, dtype)
            check = {"dtype": str(dtype).removeprefix("torch."), "variant": variant,
                     "loss": loss.item(), "ckpt_loss": ref_loss.item(),
                     "relative_error": relative_error(grads, ref)}
            if dtype == torch.float32 and variant != "hs_chunked":
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
