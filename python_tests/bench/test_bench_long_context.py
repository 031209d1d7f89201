"""benchmarks/bench_long_context.py's CPU smoke run: every variant is timed at every length, ours
reports the bytes it moved, the longest search finds its length through doubling, an out-of-memory
try (simulated with --cpu-oom-above) and bisection, and the JSON, markdown and PNG are written.
--rounds runs the variants in interleaved rounds, odd rounds reversed, and summarises them against a
baseline; a spill to disk is counted for the measured steps only; the Liger variants and --snapshot are
refused on CPU."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

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


def run_script(*options, out):
    return subprocess.run([sys.executable, "benchmarks/bench_long_context.py", "--device", "cpu", "--tiny",
                           *options, "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_bench_long_context_rounds_cpu(tmp_path):
    # Two rounds at 16 (the second in reverse order), one at 32; ratios against ckpt.
    variants = ["ckpt", "ckpt_chunked", "ours"]
    run = run_script("--variants", ",".join(variants), "--seqs", "16,32", "--rounds", "2,1", "--baseline", "ckpt",
                     "--warmup", "1", "--steps", "1", out=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "long_context.json").read_text())

    order = [(r["variant"], r["seq"], r["round"]) for r in result["runs"]]
    assert order == ([(v, 16, 1) for v in variants] + [(v, 16, 2) for v in reversed(variants)]
                     + [(v, 32, 1) for v in variants])
    assert all("error" not in r for r in result["runs"]), result["runs"]
    assert "chunk_lm_loss" in next(r["how"] for r in result["runs"] if r["variant"] == "ckpt_chunked")
    assert result["rounds"] == {"16": 2, "32": 1} and result["baseline"] == "ckpt"

    summary = {(r["variant"], r["seq"]): r for r in result["summary"]}
    assert set(summary) == {(v, s) for v in variants for s in (16, 32)}
    for (variant, seq), row in summary.items():
        rounds = 2 if seq == 16 else 1
        assert row["rounds"] == rounds and len(row["step_s_rounds"]) == rounds and len(row["ratio_rounds"]) == rounds
        assert row["step_s_min"] <= row["step_s_median"] <= row["step_s_max"]
        assert 0 < row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]
        # Each ratio is this round's tokens/s over the baseline's in the same round.
        tokens_per_s = {(r["variant"], r["round"]): r["tokens_per_s"] for r in result["runs"] if r["seq"] == seq}
        expected = [tokens_per_s[(variant, k)] / tokens_per_s[("ckpt", k)] for k in range(1, rounds + 1)]
        assert row["ratio_rounds"] == expected
    assert all(summary[("ckpt", s)]["ratio_median"] == 1.0 for s in (16, 32))

    markdown = (tmp_path / "long_context.md").read_text()
    assert "x ckpt tok/s min / median / max" in markdown and "| 16 | ours | 2 |" in markdown
    assert "| 16 | ckpt_chunked | 2 |" in markdown  # the per-run table: round 2


def test_bench_long_context_spills_per_step_exclude_the_warm_up(tmp_path):
    # A host budget of one byte: every boundary spills to disk. The disk tier's counters are totals
    # since apply(), the warm-up step included; the record gives the measured step's bytes.
    run = run_script("--variants", "ours", "--seqs", "32", "--host-budget-gb", "1e-9", "--warmup", "1",
                     "--steps", "1", out=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    row = json.loads((tmp_path / "long_context.json").read_text())["runs"][0]
    assert row["spills"] > 0 and row["to_host_GB_per_step"] > 0
    assert row["disk_written_GB_per_step"] == pytest.approx(row["to_host_GB_per_step"])
    assert row["offload_stats"]["disk_bytes_written"] == pytest.approx(2 * row["disk_written_GB_per_step"] * 1e9)


def test_bench_long_context_liger_refused_on_cpu(tmp_path):
    run = run_script("--variants", "ckpt,ckpt_liger", out=tmp_path)
    assert run.returncode == 2
    assert "ckpt_liger" in run.stderr and "needs CUDA" in run.stderr and "--device cuda" in run.stderr
    assert not (tmp_path / "long_context.json").exists()


def test_bench_long_context_snapshot_refused_on_cpu(tmp_path):
    run = run_script("--variants", "ckpt", "--snapshot", out=tmp_path)
    assert run.returncode == 2
    assert "--snapshot" in run.stderr and "--device cuda" in run.stderr
    assert not (tmp_path / "long_context.json").exists()
