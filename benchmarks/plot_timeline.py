"""The PNG of bench_compile.py --timeline: allocated memory through one training step, one line per
variant (x: the step's allocation events, scaled to 0..1 so that variants with different numbers of
events line up).

    python3 benchmarks/bench_compile.py --out DIR --seqs 16384 --variants ckpt_compiled,ours_compiled --timeline ckpt_compiled,ours_compiled
    python3 benchmarks/plot_timeline.py DIR/compile_h100.json DIR/compile_h100_timeline.png
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torch_offload.bench.plot import pyplot  # noqa: E402  (one place that says how to get matplotlib)


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    result = json.loads(Path(argv[0]).read_text())
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(9, 4.5))
    for run in result["runs"]:
        line = run.get("timeline_GB")
        if not line:
            continue
        xs = [i / max(1, len(line) - 1) for i in range(len(line))]
        axes.plot(xs, line, label=f"{run['variant']} (peak {max(line):.2f} GB)", linewidth=1.2)
    axes.set_xlabel("one step: forward, then backward (allocation events, scaled)")
    axes.set_ylabel("allocated GB")
    axes.grid(True, alpha=0.3)
    axes.legend()
    seqs = sorted({r["seq"] for r in result["runs"] if r.get("timeline_GB")})
    axes.set_title(f"torch.compile, {result.get('gpu', '')}, seq {', '.join(map(str, seqs))}")
    figure.tight_layout()
    figure.savefig(argv[1], dpi=110)
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
