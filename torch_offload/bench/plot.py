"""The benchmark's PNG: peak allocated memory and tokens/s against sequence length, one line per
variant. Also a command, for results measured where matplotlib is not installed:

    python -m torch_offload.bench.plot results.json results.png
"""
import json
import sys
from pathlib import Path


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


def plot(result: dict, path) -> None:
    """Writes the PNG of `result` (the dict main() returns / --json writes) to `path`."""
    plt = pyplot()
    runs = [r for r in result["runs"] if "tokens_per_s" in r]
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    figure, (memory, speed) = plt.subplots(1, 2, figsize=(11, 4.2))
    for variant in variants:
        rows = sorted((r for r in runs if r["variant"] == variant), key=lambda r: r["seq"])
        seqs = [r["seq"] for r in rows]
        memory.plot(seqs, [r.get("peak_allocated_GB", float("nan")) for r in rows], marker="o", label=variant)
        speed.plot(seqs, [r["tokens_per_s"] for r in rows], marker="o", label=variant)
    for axes, label in ((memory, "peak allocated GB"), (speed, "tokens/s")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("sequence length (tokens, batch 1)")
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
    memory.legend()
    figure.suptitle(f"{result.get('model', '')} Llama on {result.get('gpu', result.get('device', ''))}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


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
