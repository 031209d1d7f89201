"""benchmarks/bench_modules.py on CPU with the tiny model, as its docstring runs it: both variants
run, the modules row reports what it offloaded and freed against no offloading, and every row
carries its forward's host time (what tells a host-bound step: README, "Mode modules")."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_modules_cpu_smoke(tmp_path):
    run = subprocess.run(
        [sys.executable, "benchmarks/bench_modules.py", "--device", "cpu", "--tiny", "--seqs", "64",
         "--steps", "2", "--warmup", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| fwd host ms |" in (tmp_path / "modules_cpu.md").read_text()
    runs = {r["variant"]: r for r in json.loads((tmp_path / "modules_cpu.json").read_text())["runs"]}
    assert set(runs) == {"none", "modules *.self_attn"}
    modules = runs["modules *.self_attn"]
    assert modules["expected_GB"] > 0 and modules["freed_over_expected"] == 1.0
    assert modules["d2h_GB_per_step"] > 0 and modules["step_ratio_to_none"] > 0
    for row in runs.values():
        assert 0 < row["forward_host_ms"] < row["step_s"] * 1e3
