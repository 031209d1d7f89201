"""benchmarks/bench_long_context.py's CPU smoke run: every variant is timed at every length, ours
reports the bytes it moved, the longest search finds its length through doubling, an out-of-memory
try (simulated with --cpu-oom-above) and bisection, and the JSON, markdown and PNG are written."""
import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ["ckpt", "hf_offload", "ours", "ours_untiled"]


def test_bench_long_context_cpu(tmp_path):
    # Searches 32 (fits), 64 (out of memory: above 48), then 48 (fits): the longest is 48, exactly.
    run = subprocess.run(
        [sys.executable, "benchmarks/bench_long_context.py", "--device", "cpu", "--tiny", "--variants",
         ",".join(VARIANTS), "--seqs", "16,32", "--warmup", "1", "--steps", "1", "--longest", "--longest-start", "32",
         "--longest-step", "16", "--longest-max", "64", "--cpu-oom-above", "48", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "long_context.json").read_text())

    rows = {(r["variant"], r["seq"]): r for r in result["runs"]}
    assert set(rows) == {(v, s) for v in VARIANTS for s in (16, 32)}
    for row in rows.values():
        assert "error" not in row, row
        assert math.isfinite(row["step_s"]) and row["step_s"] > 0 and row["tokens_per_s"] > 0
        assert "peak_allocated_GB" not in row  # CPU: not measured
    for seq in (16, 32):
        for variant in ("ours", "ours_untiled"):
            assert rows[(variant, seq)]["offload_stats"]["bytes_to_host"] > 0
            assert rows[(variant, seq)]["to_host_GB_per_step"] > 0
        assert "offload_stats" not in rows[("ckpt", seq)]

    longest = {e["variant"]: e for e in result["longest"]}
    assert list(longest) == VARIANTS
    for entry in longest.values():
        assert entry["longest"] == 48 and entry["bound"] == "exact", entry
        assert [(t["seq"], t["fits"]) for t in entry["tries"]] == [(32, True), (64, False), (48, True)]
        assert all(math.isfinite(t["step_s"]) for t in entry["tries"] if t["fits"])

    assert result["argv"][0].endswith("bench_long_context.py") and result["lora"]["r"] == 16
    assert result["transformers"] and result["peft"] and result["host_ram_GB"] > 0
    markdown = (tmp_path / "long_context.md").read_text()
    assert "| ours | 48 | exact" in markdown and "| 32 | ours_untiled |" in markdown
    assert (tmp_path / "long_context.png").stat().st_size > 10_000
