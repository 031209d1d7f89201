"""python -m torch_offload.bench [--model reference|llama3-8b|tiny] [--modes ...] [--seqs ...]

Trains a random-init LlamaForCausalLM (bf16 on CUDA, fp32 on CPU; SDPA; batch 1) forward+backward
under each variant at each sequence length and prints a table: tokens/s, speed against torch's
gradient checkpointing at the same length, peak GPU memory, bytes moved, waits, link use and the
disk tier's traffic. --json keeps every measurement, --png plots them, --trace writes a
torch.profiler trace per run of our modes. On CPU there is no GPU memory, link or copy stream to
measure: those columns show "-".
Examples:

    python -m torch_offload.bench --modes checkpointing,hf_offload,hidden_states,auto --seqs 16384,32768 --json r.json
    python -m torch_offload.bench --model tiny --device cpu --seqs 64 --steps 1   # smoke test
"""
import argparse
import dataclasses
import inspect
import json
import re
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from ..apply import apply
from ..config.mode_options import (MODE_OPTIONS, AutoOptions, ModulesOptions, SelectiveOptions, canonical_mode,
                                   options_type)
from ..hooks.nothing_offloaded import NothingOffloadedWarning
from ..targets.presets import PRESETS
from .common import (LLAMA3_8B, REFERENCE, TINY, add_link_utilisation, add_ratios, build_llama, gpu_name, new_result,
                     pinned_bandwidth, release_memory, table, timed_steps)
from .disk_bandwidth import disk_bandwidth
from .plot import BASELINES, plot, pyplot

SHAPES = {"reference": REFERENCE, "llama3-8b": LLAMA3_8B, "tiny": TINY}
# Each variant with its line of --help: the baselines, then each mode of the registry (how the bench
# runs it, where it adds to the mode's summary) and the disk-tier runs of hidden_states; "selective:"
# and "modules:" take a suffix.
_HOW = {
    SelectiveOptions: "policy='attention'; selective:POLICY for another named policy, e.g. "
                      "selective:attention+qkv+out_proj",
    AutoOptions: "its trial steps run as warm-up, then the mode it kept is timed; its plan is in the JSON",
    ModulesOptions: "targets=['*.self_attn']; modules:ITEM,... for presets (" + ",".join(PRESETS) + ") or name patterns",
}
VARIANTS = {
    "none": "no checkpointing, nothing offloaded",
    "checkpointing": "torch's gradient checkpointing (non-reentrant) of every decoder layer: the ratios' baseline",
    "hf_offload": "transformers' own gradient_checkpointing_enable(offload=True): checkpointing, layer inputs "
                  "in pinned host memory",
    **{options.mode_name: f"apply(model, {options.mode_name!r}): {options.summary}"
       + (f"; {_HOW[options]}" if options in _HOW else "") for options in MODE_OPTIONS},
    "hidden_states_disk": "hidden_states through the disk tier (disk_only=True), for hosts short of RAM",
    "hidden_states_disk_direct": "the same with disk_direct_io=True (files bypass the page cache)",
}
_SUFFIXED = ("selective", "modules")
DISK_VARIANTS = ("disk", "hidden_states_disk", "hidden_states_disk_direct")
_AUTO_MAX_STEPS = 200  # auto plans in 13 steps by default, in a few dozen at most with its GPU trials
COLUMNS = [("tokens/s", "tokens_per_s", "{:.0f}"), ("x checkpointing", "x_checkpointing", "{:.3f}"),
           ("peak allocated GB", "peak_allocated_GB", "{:.2f}"), ("peak reserved GB", "peak_reserved_GB", "{:.2f}"),
           ("moved MB/step", "moved_MB", "{:.1f}"), ("compute wait ms/step", "compute_wait_ms", "{:.1f}"),
           ("host wait ms/step", "host_wait_ms", "{:.1f}"), ("D2H link use", "d2h_link_use", "{:.2f}"),
           ("H2D link use", "h2d_link_use", "{:.2f}")]
DISK_COLUMNS = [("disk read MB/step", "disk_read_MB", "{:.1f}"), ("read from page cache", "page_cache_share", "{:.2f}"),
                ("direct IO", "disk_direct_io", "{:.0f}"), ("checksum ms/step", "checksum_ms", "{:.1f}"),
                ("disk read wait ms/step", "disk_read_wait_ms", "{:.1f}"),
                ("file create ms/step", "disk_create_ms", "{:.1f}"), ("file close ms/step", "disk_close_ms", "{:.1f}")]


def _modules_selection(spec: str) -> dict:
    """"qkv,*.mlp" -> {"presets": ["qkv"], "targets": ["*.mlp"]}: a preset's name is a preset, anything
    else an fnmatch pattern (the default: every attention block)."""
    items = [item for item in spec.split(",") if item] or ["*.self_attn"]
    selection = {"presets": [i for i in items if i in PRESETS], "targets": [i for i in items if i not in PRESETS]}
    return {k: v for k, v in selection.items() if v}


def enable(model, variant: str, options: dict):
    """Turns `variant` on for `model`. Returns (our handle, or None for the baselines; what undoes
    it, leaving the model as it was). `options`: the bench's apply() options, each passed to the
    modes that take it."""
    base, _, suffix = variant.partition(":")
    if base == "none":
        return None, lambda: None
    if base in ("checkpointing", "hf_offload"):
        # transformers also hooks the input embeddings so that checkpointed layers get an input that
        # requires grad; gradient_checkpointing_disable() leaves that hook, so undo removes it too.
        had_hooks = bool(getattr(model, "_require_grads_hooks", None))
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False},
                                            **({"offload": True} if base == "hf_offload" else {}))

        def undo():
            model.gradient_checkpointing_disable()
            if not had_hooks:
                model.disable_input_require_grads()
        return None, undo
    mode = "hidden_states" if base.startswith("hidden_states") else base
    # Each bench option goes to the modes whose options have it (apply() refuses the others).
    takes = {field.name for field in dataclasses.fields(options_type(mode))}
    mode_options = {k: v for k, v in options.items() if v is not None and k in takes}
    if base not in DISK_VARIANTS:  # the disk tier's options are for the disk variants only
        for disk_option in ("disk_direct_io", "disk_io_threads"):
            mode_options.pop(disk_option, None)
    if base.startswith("hidden_states_disk"):
        mode_options.update(disk_dir=mode_options.get("disk_dir") or tempfile.gettempdir(), disk_only=True)
    if base == "hidden_states_disk_direct":
        mode_options["disk_direct_io"] = True
    if base == "selective":
        mode_options["policy"] = suffix or "attention"
    if base == "modules":
        mode_options.update(_modules_selection(suffix))
    handle = apply(model, mode, **mode_options)
    return handle, handle.remove


def _auto_plan(handle, step) -> dict:
    """Runs training steps until mode auto has decided (its trials: the warm-up of its timed steps);
    returns its plan for the row, or {"error": ...} when it did not decide."""
    auto, steps = handle.auto, 0
    while not auto.planned and steps < _AUTO_MAX_STEPS:
        step()
        steps += 1
    if not auto.planned:
        return {"error": f"auto: no plan after {steps} steps"}
    chosen = auto.chosen
    return {"auto_chosen": chosen.candidate, "auto_steps_to_plan": steps, "auto_budget_GB": auto.budget_gb,
            "auto_keep_on_device_bytes": chosen.keep_on_device_bytes, "auto_tail_blocks": chosen.tail_blocks,
            "auto_kept_mlp_blocks": chosen.kept_mlp_blocks,
            "auto_plan": [result.as_row() for result in auto.results], "auto_explain": handle.explain()}


def run(model, variant: str, seq: int, device: str, warmup: int, steps: int, options: dict,
        trace_path=None) -> dict:
    """Measures `variant` on `model` at batch 1 x `seq` tokens and leaves the model as it was.
    Returns the row: step_s, tokens_per_s, peaks (CUDA), and for our modes the bytes moved and (CUDA)
    the waits per step, "moved_nothing" with the reason where a mode offloaded nothing;
    {"error": ...} when the run runs out of memory."""
    row = {"seq": seq, "variant": variant}
    ids = torch.randint(0, model.config.vocab_size, (1, seq), device=device)
    handle, undo = None, None
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", NothingOffloadedWarning)
            handle, undo = enable(model, variant, options)

            def step():
                model.zero_grad(set_to_none=True)
                model(input_ids=ids, labels=ids).loss.backward()

            if variant == "auto":
                row.update(_auto_plan(handle, step))
                if "error" in row:
                    return row
            for _ in range(warmup):
                step()
            before = handle.stats() if handle is not None else {}
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            row.update(timed_steps(step, steps, seq, device))
            if handle is not None:
                after = handle.stats()
                _add_moved(row, {k: (after[k] - before.get(k, 0)) / steps for k in after}, after, device)
                nothing = [str(w.message).partition("offloaded nothing: ")[2] for w in caught
                           if issubclass(w.category, NothingOffloadedWarning)]
                if not row["to_host_MB"] and row.get("auto_chosen") != "checkpointing":
                    row["moved_nothing"] = (nothing or ["no saved tensor was offloaded"])[0]
            if trace_path is not None:
                _trace(step, device, trace_path)
                row["trace"] = str(trace_path)
    except torch.OutOfMemoryError:
        row = {"seq": seq, "variant": variant, "error": "out of memory"}
    finally:
        if undo is not None:
            undo()
        model.zero_grad(set_to_none=True)
        ids = None  # the step closure holds it too: freed before release_memory
        release_memory(device)
        for w in caught:  # the others are the user's to see; ours is in the row
            if not issubclass(w.category, NothingOffloadedWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return row


def _add_moved(row: dict, per_step: dict, after: dict, device: str) -> None:
    """What our mode moved per timed step (`per_step`: the engine's counters' growth over the timed
    steps, per step) into `row`, with `after`, every counter as it stood after them (since apply(),
    warm-up included), under "offload_stats". The waits are CUDA's only: on CPU no copy stream runs
    beside the compute, so the engine's zero waits measure nothing."""
    row["offload_stats"] = after
    row["to_host_MB"] = per_step.get("bytes_to_host", 0) / 2**20
    row["to_device_MB"] = per_step.get("bytes_to_device", 0) / 2**20
    row["moved_MB"] = row["to_host_MB"] + row["to_device_MB"]
    if device == "cuda":
        row["compute_wait_ms"] = per_step.get("compute_wait_ms")
        row["host_wait_ms"] = per_step.get("host_wait_ms")
    if per_step.get("disk_bytes_written"):
        row["disk_written_MB"] = per_step["disk_bytes_written"] / 2**20
        row["disk_read_MB"] = per_step["disk_bytes_read"] / 2**20
        row["checksum_ms"] = per_step["disk_checksum_ms"]
        for key in ("disk_read_wait_ms", "disk_create_ms", "disk_close_ms"):
            row[key] = per_step[key]
        row["disk_direct_io"] = after.get("disk_direct_io", 0)
        if after.get("disk_bytes_read_from_page_cache", -1) >= 0 and per_step["disk_bytes_read"]:
            row["page_cache_share"] = per_step["disk_bytes_read_from_page_cache"] / per_step["disk_bytes_read"]


def _trace(step, device: str, path) -> None:
    """One more step under torch.profiler, written as a Chrome trace (chrome://tracing, Perfetto):
    on CUDA its timeline shows our copies (side stream) next to the compute kernels."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    profiler.export_chrome_trace(str(path))


def parse_variants(text: str) -> list:
    """--modes: comma-separated variants. The items after "modules:" up to the next variant belong
    to it ("modules:qkv,core_attn,all" is modules of qkv and core_attn, then all). ValueError for an
    unknown name or an empty suffix."""
    variants = []
    for item in (i.strip() for i in text.split(",")):
        base, colon, suffix = item.partition(":")
        try:  # a mode's alias ("true", "legacy") is the mode
            base = canonical_mode(base) or base
            item = base + colon + suffix
        except ValueError:
            pass
        if item in VARIANTS or (colon and base in _SUFFIXED):
            if colon and not suffix:
                raise ValueError(f"{item!r} needs what follows the colon")
            variants.append(item)
        elif item and variants and variants[-1].startswith("modules:"):
            variants[-1] += "," + item
        elif item:
            raise ValueError(f"unknown {item!r}")
    return variants


def _help() -> str:
    width = max(len(v) for v in VARIANTS) + 2
    return (__doc__ + "\nvariants (--modes):\n"
            + "\n".join(f"  {name:<{width}}{line}" for name, line in VARIANTS.items()))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torch_offload.bench", description=_help(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, choices=sorted(SHAPES),
                        help="reference: the 1.26B reference Llama (docs/performance.md); llama3-8b: its shape; "
                             "tiny: for CPU (default: reference on CUDA, tiny on CPU)")
    parser.add_argument("--modes", default="none,checkpointing,hidden_states",
                        help="comma-separated variants (listed above; default: %(default)s)")
    parser.add_argument("--seqs", default=None,
                        help="comma-separated sequence lengths (default: 4096,16384 on CUDA, 256,1024 on CPU)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps before the timed ones (after auto's trials)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps; the table shows their median")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        choices=("cuda", "cpu"))
    parser.add_argument("--min-bytes", type=int, default=None,
                        help="min_bytes of selective, modules, all, sync and disk (default apply()'s)")
    parser.add_argument("--prefetch-depth", type=int, default=None,
                        help="prefetch_depth of our modes but auto (default apply()'s)")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="max_in_flight of our modes (default apply()'s)")
    parser.add_argument("--auto-trial-steps", type=int, default=None,
                        help="trial_steps of auto: steps per candidate, the first warming up (default apply()'s)")
    parser.add_argument("--disk-dir", default=None,
                        help="disk_dir of the disk and hidden_states_disk modes (default: the temp dir)")
    parser.add_argument("--disk-direct-io", action="store_true",
                        help="disk_direct_io=True for the disk and hidden_states_disk modes (files bypass the page "
                             "cache; hidden_states_disk_direct is hidden_states_disk with it)")
    parser.add_argument("--disk-io-threads", type=int, default=None,
                        help="disk_io_threads of the disk and hidden_states_disk modes (default apply()'s)")
    parser.add_argument("--disk-bandwidth-mb", type=int, default=1024,
                        help="MiB written and read to measure disk_dir's own bandwidth beside the disk rows; 0: not "
                             "measured (default: %(default)s)")
    parser.add_argument("--json", default=None, help="write every measurement here")
    parser.add_argument("--png", default=None, help="write a plot of peak memory and tokens/s here (matplotlib)")
    parser.add_argument("--trace", default=None, help="folder for one profiler trace per run of our modes")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (tqdm) on stderr")
    args = parser.parse_args(argv)
    try:
        args.variants = parse_variants(args.modes)
    except ValueError as error:
        parser.error(f"--modes: {error}; expected some of {', '.join(VARIANTS)}, selective:POLICY, modules:ITEM,...")
    if not args.variants:
        parser.error("--modes: no variant given")
    if "hf_offload" in args.variants:
        from transformers import PreTrainedModel
        if "offload" not in inspect.signature(PreTrainedModel.gradient_checkpointing_enable).parameters:
            import transformers
            parser.error(f"--modes hf_offload: transformers {transformers.__version__} has no "
                         "gradient_checkpointing_enable(offload=...)")
    if args.png:
        try:
            pyplot()  # before the runs, not after them
        except RuntimeError as error:
            parser.error(str(error))
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available on this machine (use --device cpu)")
    args.model = args.model or ("reference" if args.device == "cuda" else "tiny")
    args.seqs = args.seqs or ("4096,16384" if args.device == "cuda" else "256,1024")
    try:
        args.seq_list = [int(s) for s in args.seqs.split(",")]
    except ValueError:
        parser.error(f"--seqs: expected comma-separated integers, got {args.seqs!r}")
    args.config = SHAPES[args.model]
    return args


def check_variants(model, variants, options) -> None:
    """Applies and removes each variant once before anything is timed: a policy, preset or pattern
    the model refuses stops the command at once, not after the other variants' runs."""
    for variant in variants:
        try:
            _, undo = enable(model, variant, options)
        except (ValueError, TypeError) as error:
            raise SystemExit(f"torch_offload.bench: --modes {variant}: {error}") from None
        undo()


class _Progress:
    """A tqdm bar on stderr, or, without tqdm, one line per run (tqdm is optional)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.bar = total, 0, enabled, None
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            print("torch_offload.bench: tqdm is not installed (pip install tqdm): progress shown as lines",
                  file=sys.stderr)
            return
        self.bar = tqdm(total=total, unit="run", file=sys.stderr)

    def start(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_description(what)
        elif self.enabled:
            print(f"[{self.done + 1}/{self.total}] {what}", file=sys.stderr, flush=True)

    def finish(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update()
            if self.done == self.total:
                self.bar.close()


def _trial_name(trial: dict) -> str:
    """An auto trial as "candidate", with its window, unchecked tail or kept up/gate blocks if any."""
    extras = [f"{trial['keep_on_device_GB']:.2f} GB window" if trial["keep_on_device_bytes"] else "",
              f"{trial['tail_blocks']} unchecked" if trial["tail_blocks"] else "",
              f"{trial['kept_mlp_blocks']} keeping up/gate" if trial["kept_mlp_blocks"] else ""]
    extras = [e for e in extras if e]
    return trial["candidate"] + (f" ({', '.join(extras)})" if extras else "")


def notes(runs) -> list:
    """Lines printed under the table: why a run moved nothing, what auto kept."""
    lines = []
    for r in runs:
        if r.get("moved_nothing"):
            lines.append(f"{r['variant']} at {r['seq']} moved nothing, so no ratio: {r['moved_nothing']}")
        if r.get("auto_plan"):
            trials = ", ".join(f"{_trial_name(p)} {p['step_s']:.4f} s" for p in r["auto_plan"])
            lines.append(f"auto at {r['seq']} kept {r['auto_chosen']}, decided in {r['auto_steps_to_plan']} steps "
                         f"(fastest step of each trial: {trials})")
    if any(r.get("moved_nothing") for r in runs):
        lines.append("(--min-bytes sets min_bytes of selective, modules, all, sync and disk)")
    return lines


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = new_result(args, model=args.model, device=args.device, steps=args.steps, warmup=args.warmup)
    model = build_llama(args.config, args.device, max(args.seq_list))
    options = {"min_bytes": args.min_bytes, "disk_dir": args.disk_dir, "prefetch_depth": args.prefetch_depth,
               "max_in_flight": args.max_in_flight, "disk_direct_io": args.disk_direct_io or None,
               "disk_io_threads": args.disk_io_threads, "trial_steps": args.auto_trial_steps}
    check_variants(model, args.variants, options)
    if args.device == "cuda" and any(v not in BASELINES for v in args.variants):
        # Link use = bytes copied / (step time x this bandwidth), per direction.
        result["link_bandwidth"] = pinned_bandwidth()
    if any(v in DISK_VARIANTS for v in args.variants) and args.disk_bandwidth_mb > 0:
        result["disk_bandwidth"] = disk_bandwidth(args.disk_dir or tempfile.gettempdir(), args.disk_bandwidth_mb << 20)
    trace_dir = Path(args.trace) if args.trace else None
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
    progress = _Progress(len(args.seq_list) * len(args.variants), not args.no_progress)
    for seq in args.seq_list:
        for variant in args.variants:
            progress.start(f"{variant} @ {seq}")
            trace = None
            if trace_dir is not None and variant not in BASELINES:
                trace = trace_dir / f"{re.sub(r'[^A-Za-z0-9_.+-]', '_', variant)}_{seq}.json"
            result["runs"].append(run(model, variant, seq, args.device, args.warmup, args.steps, options, trace))
            progress.finish()
    add_ratios(result["runs"])
    if "link_bandwidth" in result:
        for row in result["runs"]:
            add_link_utilisation(row, result["link_bandwidth"])
    columns = COLUMNS + (DISK_COLUMNS if any(v in DISK_VARIANTS for v in args.variants) else [])
    print(f"{args.model} Llama on {gpu_name(args.device)}, batch 1, median of {args.steps} "
          f"step{'s' if args.steps != 1 else ''}"
          + ("; on CPU no GPU memory, link use or waits are measured" if args.device == "cpu" else ""))
    print("\n".join(table(result["runs"], columns) + notes(result["runs"])))
    if "disk_bandwidth" in result:
        print("disk_dir's own bandwidth (GB/s):", ", ".join(
            f"{k.removesuffix('_GBps')} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
            for k, v in result["disk_bandwidth"].items() if k != "bytes"))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    if args.png:
        plot(result, args.png)
        print(f"wrote {args.png}")
    return result


if __name__ == "__main__":
    main()
