"""python -m torch_offload.bench on CPU with the tiny model: every variant runs, the table and JSON
hold its measurements, our modes report the bytes they moved, and the profiler trace is written."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from torch_offload.bench.__main__ import main

REPO = Path(__file__).resolve().parents[1]


def test_bench_cli_smoke(tmp_path):
    # As a user runs it, in its own process: the profiler it starts for --trace leaves process-wide
    # state behind that changed a later compile test's fresh-vs-cached gradients.
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, "-m", "torch_offload.bench", "--model", "tiny", "--device", "cpu", "--seqs", "32",
         "--warmup", "0", "--steps", "1", "--modes",
         "none,checkpointing,hidden_states,hidden_states_disk,hidden_states_disk_direct,all",
         "--min-bytes", "0", "--disk-dir", str(tmp_path), "--json", str(out), "--png", str(tmp_path / "bench.png"), "--trace", str(tmp_path / "traces"), "--no-progress"],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = run.stdout
    result = json.loads(out.read_text())
    assert "| seq | variant | tokens/s | x checkpointing |" in printed
    runs = {r["variant"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"none", "checkpointing", "hidden_states", "hidden_states_disk", "hidden_states_disk_direct",
                         "all"}
    assert all(r["tokens_per_s"] > 0 and "error" not in r for r in runs.values())
    assert runs["checkpointing"]["x_checkpointing"] == 1.0
    assert runs["hidden_states"]["moved_MB"] > 0 and runs["all"]["moved_MB"] > 0
    assert "moved_MB" not in runs["none"]
    # Through the disk tier, every boundary byte is written; all but the newest file's are read back.
    disk = runs["hidden_states_disk"]
    assert disk["disk_written_MB"] == pytest.approx(disk["moved_MB"] / 2)
    assert 0 < disk["disk_read_MB"] < disk["disk_written_MB"]
    assert disk["disk_direct_io"] == 0 and disk["page_cache_share"] > 0
    # The disk's own bandwidth is measured beside the disk rows; direct IO where it can be had.
    bandwidth = result["disk_bandwidth"]
    if "error" not in bandwidth:
        assert bandwidth["direct_write_GBps"] > 0 and bandwidth["direct_read_GBps"] > 0
        direct = runs["hidden_states_disk_direct"]
        assert direct["disk_direct_io"] == 1 and direct["page_cache_share"] == 0
        assert direct["disk_written_MB"] == pytest.approx(disk["disk_written_MB"])
    assert "disk_dir's own bandwidth" in printed
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads(Path(runs["all"]["trace"]).read_text())
    assert trace["traceEvents"]
    assert result["runs"][0]["seq"] == 32


def test_bench_cli_rejects_unknown_modes():
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--device", "cpu", "--modes", "hidden_states,everything"])


def test_benchmark_scripts_use_the_package_helpers():
    # benchmarks/common.py re-exports the package's helpers: one copy of the measuring code.
    code = ("import sys; sys.path.insert(0, %r); import benchmarks.common as c, torch_offload.bench.common as p; "
            "assert c.timed_steps is p.timed_steps and c.build_llama is p.build_llama; print('ok')" % str(REPO))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr


def test_plot_command_writes_a_png_from_saved_results(tmp_path):
    results = {"model": "tiny", "gpu": "cpu", "runs": [
        {"seq": s, "variant": v, "tokens_per_s": t, "peak_allocated_GB": m}
        for s, v, t, m in [(32, "checkpointing", 10.0, 1.0), (64, "checkpointing", 8.0, 2.0),
                           (32, "hidden_states", 9.0, 0.5), (64, "hidden_states", 7.5, 1.0)]]
        + [{"seq": 64, "variant": "all", "error": "out of memory"}]}  # a failed run is left out
    (tmp_path / "r.json").write_text(json.dumps(results))
    run = subprocess.run([sys.executable, "-m", "torch_offload.bench.plot", str(tmp_path / "r.json"),
                          str(tmp_path / "r.png")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_compile_timeline_plot_writes_a_png(tmp_path):
    results = {"gpu": "cpu", "runs": [
        {"variant": "ckpt_compiled", "seq": 64, "timeline_GB": [1.0, 2.0, 3.0, 1.5]},
        {"variant": "sac_compiled", "seq": 64},  # no timeline recorded: left out
        {"variant": "ours_compiled", "seq": 64, "timeline_GB": [1.0, 1.2, 2.5, 2.0, 1.0]}]}
    (tmp_path / "c.json").write_text(json.dumps(results))
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plot_timeline.py"), str(tmp_path / "c.json"),
                          str(tmp_path / "c.png")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_link_utilisation_is_bytes_over_step_time_times_bandwidth():
    from torch_offload.bench.common import add_link_utilisation
    row = {"step_s": 2.0, "to_host_MB": 1000.0, "to_device_MB": 500.0}
    add_link_utilisation(row, {"d2h_GBps": 1000.0 * 2**20 / 1e9, "h2d_GBps": 1000.0 * 2**20 / 1e9})
    # 1000 MB at 1000 MB/s takes 1 s of a 2 s step; 500 MB takes 0.5 s.
    assert row["d2h_link_use"] == pytest.approx(0.5) and row["h2d_link_use"] == pytest.approx(0.25)
    baseline = {"step_s": 2.0}
    add_link_utilisation(baseline, {"d2h_GBps": 1.0, "h2d_GBps": 1.0})
    assert "d2h_link_use" not in baseline  # a run that copies nothing has no link use


def test_bench_selective_cpu_smoke(tmp_path):
    # The default variants run on the tiny model; auto's trial steps run before its timed step and
    # its plan (every candidate, one chosen) is in the JSON.
    run = subprocess.run([sys.executable, "benchmarks/bench_selective.py", "--device", "cpu", "--tiny", "--seqs", "64",
                          "--steps", "1", "--warmup", "1", "--noise-seq", "32", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "selective_cpu.json").read_text())
    runs = {r["variant"]: r for r in result["runs"]}
    assert set(runs) == {"ckpt", "torch_sac", "hidden", "selective", "selective_qkv", "auto"}
    # fp32 on CPU: every variant's gradients are checkpointing's, bit for bit.
    assert all(result["noise"][v]["bit_equal"] for v in ("hidden", "selective", "selective_qkv"))
    assert all(r["tokens_per_s"] > 0 for r in runs.values())
    plan = runs["auto"]["auto_plan"]
    assert len(plan) == 4 and sum(r["chosen"] for r in plan) == 1
    assert runs["auto"]["auto_chosen"] in {r["candidate"] for r in plan}


def test_bench_selective_reentrant_variants_and_rounds_cpu_smoke(tmp_path):
    # The reentrant variants and a named policy, each run twice (interleaved): the summary has one
    # row per variant, the median of its two rounds; their gradients are checkpointing's.
    variants = "ckpt,ckpt_re,hidden_re,selective_re,sel_re:attention+out_proj+fc2"
    run = subprocess.run([sys.executable, "benchmarks/bench_selective.py", "--device", "cpu", "--tiny", "--seqs", "64",
                          "--steps", "1", "--warmup", "1", "--rounds", "2", "--variants", variants,
                          "--noise-seq", "32", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "selective_cpu.json").read_text())
    assert [r["variant"] for r in result["runs"]] == variants.split(",") * 2
    summary = {r["variant"]: r for r in result["summary"]}
    assert set(summary) == set(variants.split(",")) and all(r["rounds"] == 2 for r in summary.values())
    assert all(len(r["step_s_rounds"]) == 2 for r in summary.values())
    assert summary["selective_re"]["offload_stats"]["saves"] > 0
    assert all(result["noise"][v]["bit_equal"] for v in ("hidden_re", "selective_re", "sel_re:attention+out_proj+fc2"))


def test_bench_selective_tail_and_loss_suffixes_cpu_smoke(tmp_path):
    # VARIANT#N leaves the last N blocks unchecked; VARIANT/LOSS chunks that variant's loss only:
    # the gradients stay checkpointing's (fp32: bit for bit for the tail, within 1e-6 for the loss).
    variants = "ckpt,hidden#1,selective#2/grads_in_forward,ckpt/chunked"
    run = subprocess.run([sys.executable, "benchmarks/bench_selective.py", "--device", "cpu", "--tiny", "--seqs", "64",
                          "--steps", "1", "--warmup", "1", "--variants", variants, "--noise-seq", "32",
                          "--out", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "selective_cpu.json").read_text())
    assert [r["variant"] for r in result["runs"]] == variants.split(",")
    assert result["noise"]["hidden#1"]["bit_equal"]
    assert result["runs"][1]["offload_stats"]["saves"] > 0
    refused = subprocess.run([sys.executable, "benchmarks/bench_selective.py", "--device", "cpu", "--tiny",
                              "--variants", "ckpt#1", "--out", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert refused.returncode == 2 and "unknown variant 'ckpt#1'" in refused.stderr


def test_bench_activations_cpu_smoke_with_trl(tmp_path):
    # TRL's OffloadActivations runs beside ours in the same process (trl is pinned in requirements.txt).
    run = subprocess.run([sys.executable, "benchmarks/bench_activations.py", "--device", "cpu", "--tiny", "--seqs", "64",
                          "--variants", "none,all,trl", "--no-noise", "--soak-steps", "2", "--steps", "1", "--warmup", "1",
                          "--min-bytes", "0", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    runs = {r["variant"]: r for r in json.loads((tmp_path / "activations_cpu.json").read_text())["runs"]}
    assert set(runs) == {"none", "all", "trl"} and all("step_s" in r for r in runs.values())
    assert runs["all"]["d2h_GB_per_step"] > 0
    assert "`all` step / TRL step" in run.stdout


def test_bench_compile_cpu_smoke(tmp_path):
    # Compiled checkpointing and ours, both without the dense causal mask, each from empty compile
    # caches; the gradient comparison runs first. fp32 on CPU: compiled gradients within rounding
    # of eager checkpointing's, and ours compared with compiled checkpointing with the same option.
    run = subprocess.run([sys.executable, "benchmarks/bench_compile.py", "--device", "cpu", "--tiny", "--seqs", "32",
                          "--steps", "1", "--noise-seq", "32", "--variants", "ckpt_compiled_causal,ours_compiled_causal",
                          "--out", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "compile_cpu.json").read_text())
    noise = result["noise"]
    assert noise["floor"] < 1e-5
    assert 0 <= noise["ckpt_compiled_causal"] < 1e-5 and 0 <= noise["ours_compiled_causal"] < 1e-5
    runs = {r["variant"]: r for r in result["runs"]}
    assert set(runs) == {"ckpt_compiled_causal", "ours_compiled_causal"}
    assert all(r["compile_s"] > 0 and r["tokens_per_s"] > 0 for r in runs.values())
    (offloaded,) = runs["ours_compiled_causal"]["offloaded_per_graph"]
    assert offloaded >= 2  # the tiny model's 2 block inputs at least
    (summary,) = result["summary"]
    assert summary["variant"] == "ours_compiled_causal" and summary["against"] == "ckpt_compiled_causal"
    assert "Gradients at seq 32" in (tmp_path / "compile_cpu.md").read_text()
