"""One benchmark run: a variant (no checkpointing, torch's gradient checkpointing, or one of our
modes) trained forward+backward at one sequence length, timed, with the engine's traffic."""
import tempfile

import torch

from ..apply import apply
from .common import GB, LLAMA3_8B, REFERENCE, TINY, release_memory, timed_steps

SHAPES = {"reference": REFERENCE, "llama3-8b": LLAMA3_8B, "tiny": TINY}
BASELINES = ("none", "checkpointing")
# hidden_states_disk: hidden_states through the disk tier (disk_only=True), for hosts short of RAM;
# hidden_states_disk_direct: the same with disk_direct_io=True (files bypass the page cache).
MODES = ("hidden_states", "hidden_states_disk", "hidden_states_disk_direct", "all", "sync", "disk")
VARIANTS = BASELINES + MODES
_TAKES_MIN_BYTES = ("all", "sync", "disk")
DISK_VARIANTS = ("disk", "hidden_states_disk", "hidden_states_disk_direct")


def add_link_utilisation(row: dict, bandwidth: dict) -> None:
    """Link utilisation of a run of ours per direction: bytes copied / (step time x the link's
    measured bandwidth, `bandwidth` as pinned_bandwidth() returns it)."""
    for direction, moved in (("d2h", row.get("to_host_MB")), ("h2d", row.get("to_device_MB"))):
        if moved is not None and row.get("step_s"):
            seconds_needed = moved * 2**20 / (bandwidth[direction + "_GBps"] * GB)
            row[direction + "_link_use"] = seconds_needed / row["step_s"]


def run(model, variant: str, seq: int, device: str, warmup: int, steps: int, options: dict,
        trace_path=None) -> dict:
    """Measures `variant` on `model` at batch 1 x `seq` tokens and leaves the model as it was.
    `options`: apply() options (min_bytes only goes to the modes that take it). Returns the row:
    step_s, tokens_per_s, peaks (CUDA), and for our modes the bytes moved and the waits per step;
    {"error": ...} when the run runs out of memory."""
    row = {"seq": seq, "variant": variant}
    ids = torch.randint(0, model.config.vocab_size, (1, seq), device=device)
    handle = None
    try:
        if variant == "checkpointing":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif variant != "none":
            mode_options = {k: v for k, v in options.items()
                            if v is not None and (k != "min_bytes" or variant in _TAKES_MIN_BYTES)
                            and (k != "disk_direct_io" or variant in DISK_VARIANTS)}
            if variant.startswith("hidden_states_disk"):
                mode_options.update(disk_dir=mode_options.get("disk_dir") or tempfile.gettempdir(), disk_only=True)
            if variant == "hidden_states_disk_direct":
                mode_options.update(disk_direct_io=True)
            handle = apply(model, variant.split("_disk")[0], **mode_options)

        def step():
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()

        for _ in range(warmup):
            step()
        before = handle.stats() if handle is not None else {}
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row.update(timed_steps(step, steps, seq, device))
        if handle is not None:
            after = handle.stats()
            per_step = {k: (after[k] - before.get(k, 0)) / steps for k in after}
            row["moved_MB"] = (per_step["bytes_to_host"] + per_step["bytes_to_device"]) / 2**20
            row["to_host_MB"] = per_step["bytes_to_host"] / 2**20
            row["to_device_MB"] = per_step["bytes_to_device"] / 2**20
            row["compute_wait_ms"] = per_step.get("compute_wait_ms")
            row["host_wait_ms"] = per_step.get("host_wait_ms")
            if per_step.get("disk_bytes_written"):
                row["disk_written_MB"] = per_step["disk_bytes_written"] / 2**20
                row["disk_read_MB"] = per_step["disk_bytes_read"] / 2**20
                row["checksum_ms"] = per_step["disk_checksum_ms"]
                row["disk_direct_io"] = after.get("disk_direct_io", 0)
                if after.get("disk_bytes_read_from_page_cache", -1) >= 0 and per_step["disk_bytes_read"]:
                    row["page_cache_share"] = per_step["disk_bytes_read_from_page_cache"] / per_step["disk_bytes_read"]
        if trace_path is not None:
            _trace(step, device, trace_path)
            row["trace"] = str(trace_path)
    except torch.OutOfMemoryError:
        row["error"] = "out of memory"
    finally:
        if handle is not None:
            handle.remove()
        if variant == "checkpointing":
            model.gradient_checkpointing_disable()
        model.zero_grad(set_to_none=True)
        del ids
        release_memory(device)
    return row


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


def add_ratios(rows: list) -> None:
    """x_checkpointing: tokens/s over the checkpointing run's at the same sequence length."""
    baseline = {r["seq"]: r["tokens_per_s"] for r in rows
                if r["variant"] == "checkpointing" and "tokens_per_s" in r}
    for r in rows:
        if r["seq"] in baseline and "tokens_per_s" in r:
            r["x_checkpointing"] = r["tokens_per_s"] / baseline[r["seq"]]
