"""What the benchmark scripts share. The measuring helpers live in the package
(torch_offload/bench/common.py, also used by `python -m torch_offload.bench`); this file adds the
scripts' command-line options and gradient comparison. Import after putting the repository root on
sys.path."""
import sys
from pathlib import Path

import torch

import torch_offload
from torch_offload.bench.common import (GB, LLAMA3_8B, REFERENCE, TINY, build_llama, gpu_name,  # noqa: F401
                                        log, new_result, pinned_bandwidth, release_memory,
                                        short_gpu_name, sync, table, timed_steps)


def add_run_args(parser, seqs: str, steps: int, warmup=2) -> None:
    """The options every benchmark has: sequence lengths, warm-up (None: the script has none) and
    measured steps, device, the tiny smoke-test model, output folder."""
    parser.add_argument("--seqs", default=seqs)
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a tiny model, for CPU smoke runs")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))


def finish_run_args(args, shape: dict, tiny_shape: dict = TINY, tiny_seqs: str = "64,128"):
    """Sets args.config (the model shape) and args.seq_list; tiny runs default to short sequences."""
    args.config = tiny_shape if args.tiny else shape
    if args.tiny and "--seqs" not in sys.argv:
        args.seqs = tiny_seqs
    args.seq_list = [int(s) for s in args.seqs.split(",") if s]  # --seqs "": none
    return args


# Hugging Face options a compiled variant's name can end with, in this order: VARIANT_causal_detach.
HF_OPTIONS = ("_causal", "_detach")


def split_hf_options(variant: str):
    """VARIANT_causal_detach -> ("VARIANT", "_causal_detach")."""
    suffix = ""
    for option in reversed(HF_OPTIONS):
        if variant.endswith(option):
            variant, suffix = variant[:-len(option)], option + suffix
    return variant, suffix


def apply_hf_options(variant: str, model) -> str:
    """Turns on what `variant`'s suffixes name (_causal: torch_offload.sdpa_is_causal, no dense causal
    mask; _detach: torch_offload.detach_logits) on `model`; returns the variant without them."""
    variant, suffix = split_hf_options(variant)
    if "_causal" in suffix:
        torch_offload.sdpa_is_causal(model)
    if "_detach" in suffix:
        torch_offload.detach_logits(model)
    return variant


def flat_grads(model) -> torch.Tensor:
    """Every parameter gradient of `model`, in fp32, as one vector (for relative errors)."""
    return torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])


def median_rounds(runs: list) -> list:
    """One row per (variant, seq) of `runs` (every round of --rounds, which interleaves the variants
    so that drift of the machine falls on all of them alike): the round with the median step time,
    with `rounds` and every round's `step_s_rounds`; a failed run stands where no round succeeded."""
    groups = {}
    for r in runs:
        if "error" not in r:
            groups.setdefault((r["variant"], r["seq"]), []).append(r)
    rows = []
    for rounds in groups.values():
        rounds = sorted(rounds, key=lambda r: r["step_s"])
        row = dict(rounds[len(rounds) // 2])
        row["rounds"] = len(rounds)
        row["step_s_rounds"] = [r["step_s"] for r in rounds]
        rows.append(row)
    for r in runs:
        if "error" in r and (r["variant"], r["seq"]) not in groups:
            rows.append(r)
    return rows


def reference_from_argv(default_seq: int, default_rounds: int):
    """For the diagnostic scripts of results/ (`script.py [SEQ] [ROUNDS]`): seq and rounds from the
    command line, the reference model on CUDA and one batch of random token ids."""
    seq = int(sys.argv[1]) if len(sys.argv) > 1 else default_seq
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else default_rounds
    model = build_llama(REFERENCE, "cuda", seq)
    return seq, rounds, model, torch.randint(0, REFERENCE["vocab"], (1, seq), device="cuda")
