"""The benchmark's PNG: peak allocated GPU memory and tokens/s against sequence length, one line per
variant. Also a command, for results measured where matplotlib is not installed:

    python -m torch_offload.bench.plot results.json results.png

Only measured values are drawn: a run that failed (out of memory) or moved nothing is left out of
its line, not drawn as zero, and the legend says which; without a memory figure (CPU runs) the
memory panel says so instead of drawing an axis of zeros.
"""
import json
import math
import sys
from pathlib import Path

BASELINES = ("none", "plain", "checkpointing", "ckpt", "hf_offload")  # drawn dashed: what ours is read against


def pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise RuntimeError("torch_offload.bench: --png needs matplotlib (pip install matplotlib); "
                           "or write --json and plot it elsewhere with "
                           "`python -m torch_offload.bench.plot results.json results.png`") from error
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    return plt


def seq_label(seq: int) -> str:
    """16384 -> "16k", 1000 -> "1000": a tick label of the sequence axis."""
    return f"{seq // 1024}k" if seq >= 1024 and seq % 1024 == 0 else str(seq)


def _measured(row: dict, key: str) -> float:
    """The row's value of `key`, or NaN (a gap in the line) where it was not measured."""
    value = row.get(key) if "error" not in row and not row.get("moved_nothing") else None
    return float(value) if value is not None else math.nan


def _label(variant: str, rows: list) -> str:
    """The legend entry: the variant, and the lengths where it has no point and why."""
    missing = {}
    for r in rows:
        why = r.get("error") or ("moved nothing" if r.get("moved_nothing") else None)
        if why:
            missing.setdefault(why, []).append(seq_label(r["seq"]))
    notes = "; ".join(f"{why} at {', '.join(seqs)}" for why, seqs in missing.items())
    return f"{variant} ({notes})" if notes else variant


def _is_cpu(result: dict) -> bool:
    return result.get("device") == "cpu" or result.get("gpu") == "cpu"


def plot(result: dict, path):
    """Writes the PNG of `result` (the dict main() returns / --json writes) to `path`; returns the
    matplotlib Figure (closed: inspectable, not shown)."""
    plt = pyplot()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    runs = result["runs"]
    seqs = sorted({r["seq"] for r in runs})
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    has_memory = any(not math.isnan(_measured(r, "peak_allocated_GB")) for r in runs)
    colours = plt.get_cmap("tab10").colors
    figure, (memory, speed) = plt.subplots(1, 2, figsize=(12, 4.6))
    for i, variant in enumerate(variants):
        rows = {r["seq"]: r for r in runs if r["variant"] == variant}
        # Past ten variants the colours repeat with another marker: tab20's paired shades read as one.
        style = dict(marker="os^D"[i // len(colours) % 4], color=colours[i % len(colours)],
                     linestyle="--" if variant in BASELINES else "-",
                     label=_label(variant, list(rows.values())))
        for axes, key in ((memory, "peak_allocated_GB"), (speed, "tokens_per_s")):
            if axes is memory and not has_memory:
                continue
            # NaN where a length was not measured: the line breaks there instead of dropping to zero.
            axes.plot(seqs, [_measured(rows[s], key) if s in rows else math.nan for s in seqs], **style)
    panels = ((memory, "peak allocated GPU memory (GB)"), (speed, "tokens/s"))
    for axes, label in panels:
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_locator(FixedLocator(seqs))
        axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: seq_label(int(round(x)))))
        axes.xaxis.set_minor_locator(NullLocator())
        axes.set_xlim(seqs[0] / 1.5, seqs[-1] * 1.5)
        axes.set_xlabel("sequence length (tokens, batch 1)")
        axes.set_ylabel(label)
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
    if not has_memory:
        memory.set_yticks([])
        memory.grid(False)
        memory.text(0.5, 0.5, "peak memory is not measured on CPU\n(no GPU memory to measure)" if _is_cpu(result)
                    else "no peak memory was measured", transform=memory.transAxes, ha="center", va="center",
                    fontsize=12, color="0.35")
    handles, labels = speed.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), frameon=False, fontsize=9)
    steps = result.get("steps")
    steps = f", median of {steps} step{'s' if steps != 1 else ''}" if steps else ""
    figure.suptitle(f"{result.get('model', '')} Llama on {result.get('gpu', result.get('device', ''))}, "
                    f"training step at batch 1{steps}")
    rows_of_legend = math.ceil(len(labels) / 4)
    figure.tight_layout(rect=(0, 0.04 + 0.05 * rows_of_legend, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return figure


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m torch_offload.bench.plot RESULTS.json OUT.png", file=sys.stderr)
        return 2
    plot(json.loads(Path(argv[0]).read_text()), argv[1])
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
