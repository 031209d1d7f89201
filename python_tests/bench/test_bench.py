"""python -m torch_offload.bench on CPU with the tiny model: every variant runs, the table and JSON
hold its measurements, a ratio only where both rows were measured and the mode moved something,
our modes report the bytes they moved, the profiler trace is written, and the PNG has the sequence
lengths on its axis and no memory figures where none were measured. Also the benchmarks/ scripts'
CPU smoke runs."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_offload.bench.__main__ import VARIANTS, main, parse_args, parse_variants, run
from torch_offload.bench.common import TINY, build_llama, table
from torch_offload.bench.plot import main as plot_main
from torch_offload.bench.plot import plot

REPO = Path(__file__).resolve().parents[2]
EVERY_VARIANT = ["none", "checkpointing", "hf_offload", "hidden_states", "hidden_states_disk",
                 "hidden_states_disk_direct", "selective", "selective:attention+qkv+out_proj", "auto", "modules",
                 "modules:qkv,core_attn", "all", "sync", "disk"]


def test_disk_options_go_to_the_disk_variants_only():
    # Without --disk-dir, `all` has no disk tier: the disk tier's options would be refused there.
    result = main(["--model", "tiny", "--device", "cpu", "--seqs", "32", "--warmup", "0", "--steps", "1",
                   "--modes", "all,disk", "--min-bytes", "0", "--disk-io-threads", "2", "--disk-bandwidth-mb", "0",
                   "--no-progress"])
    runs = {r["variant"]: r for r in result["runs"]}
    assert all("error" not in r for r in runs.values()), runs
    assert runs["disk"]["disk_written_MB"] > 0 and "disk_written_MB" not in runs["all"]


def test_bench_cli_every_variant(tmp_path):
    # As a user runs it, in its own process: the profiler it starts for --trace leaves process-wide
    # state behind that changed a later compile test's fresh-vs-cached gradients.
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, "-m", "torch_offload.bench", "--model", "tiny", "--device", "cpu", "--seqs", "32",
         "--warmup", "0", "--steps", "1", "--auto-trial-steps", "1", "--modes", ",".join(EVERY_VARIANT),
         "--min-bytes", "0", "--disk-dir", str(tmp_path), "--disk-io-threads", "2", "--disk-bandwidth-mb", "16",
         "--json", str(out),
         "--png", str(tmp_path / "bench.png"), "--trace", str(tmp_path / "traces"), "--no-progress"],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = run.stdout
    result = json.loads(out.read_text())
    assert "| seq | variant | tokens/s | x checkpointing |" in printed
    runs = {r["variant"]: r for r in result["runs"]}
    assert list(runs) == EVERY_VARIANT
    assert all(r["tokens_per_s"] > 0 and "error" not in r for r in runs.values())
    # With min_bytes=0 every mode moved something: every row has its ratio, checkpointing's is 1.
    assert all("moved_nothing" not in r and r["x_checkpointing"] > 0 for r in runs.values())
    assert runs["checkpointing"]["x_checkpointing"] == 1.0
    for variant in EVERY_VARIANT[3:]:
        if variant == "auto" and runs["auto"]["auto_chosen"] == "checkpointing":
            continue  # kept torch's checkpointing, which moves nothing by design
        assert runs[variant]["moved_MB"] > 0, variant
        assert runs[variant]["offload_stats"]["bytes_to_host"] > 0, variant
    # transformers' offload and the baselines have no counters of ours; nothing of CUDA's on CPU.
    assert all("moved_MB" not in runs[v] for v in ("none", "checkpointing", "hf_offload"))
    assert not any(k in r for r in runs.values() for k in ("peak_allocated_GB", "compute_wait_ms", "d2h_link_use"))
    hf_line = next(line for line in printed.splitlines() if line.startswith("| 32 | hf_offload |"))
    assert hf_line.split(" | ")[4:7] == ["-", "-", "-"]  # peaks and moved: not measured
    assert runs["selective:attention+qkv+out_proj"]["moved_MB"] >= runs["selective"]["moved_MB"]
    # auto: its trials ran before the timed step, its plan (one trial per candidate, one kept) is kept.
    auto = runs["auto"]
    assert auto["auto_steps_to_plan"] > len(auto["auto_plan"]) == 4  # one step per trial, then the deciding one
    assert sum(p["chosen"] for p in auto["auto_plan"]) == 1
    assert auto["auto_chosen"] in {p["candidate"] for p in auto["auto_plan"]}
    assert "| candidate |" in auto["auto_explain"] and f"auto at 32 kept {auto['auto_chosen']}" in printed
    # Through the disk tier, every boundary byte is written; all but the newest file's are read back.
    disk = runs["hidden_states_disk"]
    assert disk["disk_written_MB"] == pytest.approx(disk["moved_MB"] / 2)
    assert 0 < disk["disk_read_MB"] < disk["disk_written_MB"]
    assert disk["disk_direct_io"] == 0 and disk["page_cache_share"] > 0
    assert disk["disk_read_wait_ms"] > 0  # the restores that read a file waited for it
    assert disk["disk_create_ms"] > 0 and disk["disk_close_ms"] > 0  # every step makes and closes files
    # The disk's own bandwidth is measured beside the disk rows; direct IO where it can be had.
    bandwidth = result["disk_bandwidth"]
    assert bandwidth.get("bytes", 16 << 20) == 16 << 20
    if "error" not in bandwidth:
        assert bandwidth["direct_write_GBps"] > 0 and bandwidth["direct_read_GBps"] > 0
        direct = runs["hidden_states_disk_direct"]
        assert direct["disk_direct_io"] == 1 and direct["page_cache_share"] == 0
        assert direct["disk_written_MB"] == pytest.approx(disk["disk_written_MB"])
    assert "disk_dir's own bandwidth" in printed
    import matplotlib.image
    assert matplotlib.image.imread(tmp_path / "bench.png").ndim == 3  # a PNG matplotlib reads back
    trace = json.loads(Path(runs["all"]["trace"]).read_text())
    assert trace["traceEvents"]
    assert Path(runs["modules:qkv,core_attn"]["trace"]).name == "modules_qkv_core_attn_32.json"
    assert result["runs"][0]["seq"] == 32 and result["device"] == "cpu"


def test_bench_moved_nothing_has_no_ratio_and_the_cpu_plot_says_memory_is_not_measured(tmp_path, capsys):
    # apply()'s own min_bytes (1 MiB) is above every tensor the tiny model saves at these lengths:
    # all moved nothing. Its row says so where the ratio would be; the JSON has no ratio for it.
    result = main(["--model", "tiny", "--device", "cpu", "--seqs", "32,64", "--warmup", "0", "--steps", "1",
                   "--modes", "checkpointing,all", "--no-progress", "--png", str(tmp_path / "cpu.png")])
    printed = capsys.readouterr().out
    rows = {(r["variant"], r["seq"]): r for r in result["runs"]}
    for seq in (32, 64):
        assert rows["checkpointing", seq]["x_checkpointing"] == 1.0
        moved_nothing = rows["all", seq]
        assert moved_nothing["moved_MB"] == 0 and "x_checkpointing" not in moved_nothing
        assert "under min_bytes=1048576" in moved_nothing["moved_nothing"]
        line = next(line for line in printed.splitlines() if line.startswith(f"| {seq} | all |"))
        assert line.split(" | ")[3] == "moved nothing: min_bytes=1048576 above every saved activation"
        assert line.split(" | ")[4:6] == ["-", "-"]  # peak memory: not measured on CPU
        assert f"all at {seq} moved nothing, so no ratio" in printed
    figure = plot(result, tmp_path / "again.png")
    memory, speed = figure.axes
    assert [t.get_text().splitlines()[0] for t in memory.texts] == ["peak memory is not measured on CPU"]
    assert not memory.lines  # nothing drawn where nothing was measured
    assert list(speed.get_xticks()) == [32, 64] and _labels(speed) == ["32", "64"]
    checkpointing, all_ = speed.lines
    assert list(checkpointing.get_xdata()) == [32, 64] and not any(map(math.isnan, checkpointing.get_ydata()))
    assert all(map(math.isnan, all_.get_ydata()))  # all's points are left out, not drawn as zero
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert legend == ["checkpointing", "all (moved nothing at 32, 64)"]
    assert (tmp_path / "cpu.png").read_bytes()[:4] == b"\x89PNG"


def _labels(axes) -> list:
    axes.figure.canvas.draw()  # tick labels are formatted at draw time
    return [t.get_text() for t in axes.get_xticklabels()]


def gpu_like_result() -> dict:
    """Results as a GPU run writes them (the reference model on an H100, by hand): three lengths,
    peaks and tokens/s; none and all out of memory at 64k, all moving nothing at 4k."""
    figures = {  # variant: [(peak allocated GB, tokens/s) at 4k, 16k, 64k]; None: out of memory
        "none": [(22.4, 52000), (64.1, 40500), None],
        "checkpointing": [(6.9, 39000), (11.8, 31500), (31.5, 17800)],
        "hf_offload": [(6.6, 30500), (10.4, 26000), (25.8, 15300)],
        "hidden_states": [(6.5, 38600), (10.2, 31300), (25.4, 17700)],
        "selective": [(6.4, 40500), (9.9, 33800), (24.9, 19900)],
        "auto": [(6.9, 41200), (11.5, 34500), (30.1, 20100)],
        "modules": [(18.9, 47000), (52.0, 38000), (70.2, 24000)],
        "all": [(23.0, 51000), (40.3, 36000), None],
    }
    runs = []
    for variant, points in figures.items():
        for seq, point in zip((4096, 16384, 65536), points):
            if point is None:
                runs.append({"seq": seq, "variant": variant, "error": "out of memory"})
            else:
                runs.append({"seq": seq, "variant": variant, "peak_allocated_GB": point[0], "tokens_per_s": point[1]})
            if (variant, seq) == ("all", 4096):
                runs[-1]["moved_nothing"] = "12 saved tensors were under min_bytes=1048576"
    return {"model": "reference", "gpu": "NVIDIA H100 80GB HBM3", "device": "cuda", "steps": 5, "runs": runs}


def test_plot_of_gpu_results_has_the_lengths_on_its_axis_and_leaves_failed_points_out(tmp_path):
    figure = plot(gpu_like_result(), tmp_path / "gpu.png")
    memory, speed = figure.axes
    for axes in (memory, speed):
        assert axes.get_xscale() == "log" and list(axes.get_xticks()) == [4096, 16384, 65536]
        assert _labels(axes) == ["4k", "16k", "64k"]
        assert axes.get_ylim()[0] == 0
    assert not memory.texts  # measured: no "not measured" note
    lines = {line.get_label().split(" (")[0]: line for line in memory.lines}
    assert len(lines) == 8 and list(lines["checkpointing"].get_ydata()) == [6.9, 11.8, 31.5]
    none = list(lines["none"].get_ydata())
    assert none[:2] == [22.4, 64.1] and math.isnan(none[2])  # out of memory: a gap, not a zero
    all_ = list(lines["all"].get_ydata())
    assert math.isnan(all_[0]) and math.isnan(all_[2]) and all_[1] == 40.3
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert "none (out of memory at 64k)" in legend
    assert "all (moved nothing at 4k; out of memory at 64k)" in legend
    assert lines["checkpointing"].get_linestyle() == "--" and lines["hidden_states"].get_linestyle() == "-"
    import matplotlib.image
    image = matplotlib.image.imread(tmp_path / "gpu.png")
    assert image.shape[0] > 400 and image.shape[1] > 1000


def test_plot_command_writes_a_png_from_saved_results(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(gpu_like_result()))
    assert plot_main([str(tmp_path / "r.json"), str(tmp_path / "r.png")]) == 0
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert plot_main([str(tmp_path / "r.json")]) == 2  # usage


def test_bench_help_lists_every_variant_with_one_line(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    printed = capsys.readouterr().out.split("variants (--modes):\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in printed] == list(VARIANTS)
    assert set(VARIANTS) >= {"none", "checkpointing", "hf_offload", "hidden_states", "hidden_states_disk",
                             "hidden_states_disk_direct", "selective", "auto", "modules", "all", "sync", "disk"}


def test_bench_without_matplotlib_or_tqdm_says_so(monkeypatch, capsys):
    from torch_offload.bench.__main__ import _Progress
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with pytest.raises(SystemExit):  # refused before any run
        parse_args(["--device", "cpu", "--png", "out.png"])
    assert "--png needs matplotlib (pip install matplotlib)" in capsys.readouterr().err
    progress = _Progress(2, enabled=True)
    progress.start("all @ 64")
    assert capsys.readouterr().err.splitlines() == [
        "torch_offload.bench: tqdm is not installed (pip install tqdm): progress shown as lines", "[1/2] all @ 64"]


def test_bench_cli_rejects_unknown_modes():
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--device", "cpu", "--modes", "hidden_states,everything"])
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--device", "cpu", "--modes", "selective:"])


def test_bench_variants_parse_suffixes():
    assert parse_variants("none,modules:qkv,core_attn,*.mlp,all,selective:attention+qkv") == [
        "none", "modules:qkv,core_attn,*.mlp", "all", "selective:attention+qkv"]
    assert parse_variants("modules,auto") == ["modules", "auto"]
    with pytest.raises(ValueError, match="unknown 'qkv'"):
        parse_variants("all,qkv")


def test_bench_refuses_a_policy_the_model_refuses_before_timing(capsys):
    # Checked once on the model before any variant is timed: nothing runs, the error names the variant.
    with pytest.raises(SystemExit, match="--modes selective:attention\\+bogus: "):
        main(["--model", "tiny", "--device", "cpu", "--seqs", "32", "--no-progress",
              "--modes", "checkpointing,selective:attention+bogus"])
    assert "| seq |" not in capsys.readouterr().out


@pytest.mark.parametrize("variant", ["checkpointing", "hf_offload"])
def test_bench_undoes_transformers_checkpointing(variant):
    # Each run leaves the model as it was: checkpointing off, no input-embedding hook left behind.
    model = build_llama(TINY, "cpu", 32)
    hooks = dict(model.model.embed_tokens._forward_hooks)
    row = run(model, variant, 16, "cpu", 0, 1, {})
    assert row["tokens_per_s"] > 0 and "moved_MB" not in row
    assert not model.is_gradient_checkpointing and not getattr(model, "_require_grads_hooks", None)
    assert dict(model.model.embed_tokens._forward_hooks) == hooks


def test_table_prints_no_ratio_for_a_run_that_moved_nothing():
    columns = [("tokens/s", "tokens_per_s", "{:.0f}"), ("x checkpointing", "x_checkpointing", "{:.3f}"),
               ("peak allocated GB", "peak_allocated_GB", "{:.2f}")]
    lines = table([{"seq": 64, "variant": "checkpointing", "tokens_per_s": 100.0, "x_checkpointing": 1.0},
                   {"seq": 64, "variant": "all", "tokens_per_s": 120.0,
                    "moved_nothing": "58 saved tensors were under min_bytes=1048576; 18 more were parameters"},
                   {"seq": 128, "variant": "all", "error": "out of memory"},
                   {"seq": 64, "variant": "sync", "tokens_per_s": 90.0,
                    "moved_nothing": "all 76 saved tensors were parameters, buffers or views of them (kept)"}], columns)
    assert lines[2] == "| 64 | checkpointing | 100 | 1.000 | - |"
    assert lines[3] == "| 64 | all | 120 | moved nothing: min_bytes=1048576 above every saved activation | - |"
    assert lines[4] == "| 128 | all | out of memory |  |  |"
    assert lines[5] == ("| 64 | sync | 90 | moved nothing: all 76 saved tensors were parameters, buffers or views of "
                        "them (kept) | - |")


def test_benchmark_scripts_use_the_package_helpers():
    # benchmarks/common.py re-exports the package's helpers: one copy of the measuring code.
    code = ("import sys; sys.path.insert(0, %r); import benchmarks.common as c, torch_offload.bench.common as p; "
            "assert c.timed_steps is p.timed_steps and c.build_llama is p.build_llama; print('ok')" % str(REPO))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr


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


def test_trace_summary_tells_the_compute_streams_idle_time_and_longest_gaps(tmp_path):
    # A profiled step as torch.profiler exports it: the compute stream (7) runs three kernels with
    # gaps of 2 and 5 us between them; a copy stream (9) runs less kernel time; a copy and a
    # runtime call are counted apart. Times in microseconds, as the trace writes them.
    def kernel(name, stream, ts, dur):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}
    events = [kernel("gemm", 7, 100, 10), kernel("norm", 7, 112, 8), kernel("attention", 7, 125, 5),
              kernel("side", 9, 101, 3),
              {"cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 102, "dur": 4,
               "args": {"stream": 9}},
              {"cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "ts": 99, "dur": 2}]
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    code = ("import sys, json; sys.path.insert(0, %r); from benchmarks.common import trace_summary; "
            "print(json.dumps(trace_summary(sys.argv[1], gaps=1)))" % str(REPO))
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "trace.json")], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["compute_stream"] == "7" and summary["compute_kernels"] == 3
    assert summary["compute_busy_ms"] == pytest.approx(0.023)
    assert summary["compute_idle_ms"] == pytest.approx(0.007)  # 30 us of span, 23 of kernels
    assert summary["kernel_span_ms"] == pytest.approx(0.030)
    assert summary["largest_gaps"] == [{"ms": pytest.approx(0.005), "after": "norm", "before": "attention",
                                        "at_ms": pytest.approx(0.020)}]
    assert summary["kernel_busy_ms_per_stream"]["9"] == pytest.approx(0.003)
    assert summary["copies_ms"] == {"9:Memcpy DtoH (Device -> Pinned)": pytest.approx(0.004)}
    assert summary["runtime_top"]["cudaStreamWaitEvent"]["count"] == 1


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
    # TRL's OffloadActivations runs beside ours in the same process (trl is pinned in requirements/test.txt),
    # alone and as SFTConfig(activation_offloading=True) runs it, under the model's checkpointing; in
    # interleaved rounds, every run on a fresh model, the order reversed in the second round. A mode that
    # offloads whatever the size (hidden_states) runs beside them without --min-bytes.
    run = subprocess.run([sys.executable, "benchmarks/bench_activations.py", "--device", "cpu", "--tiny", "--seqs", "64",
                          "--variants", "none,all,hidden_states,checkpointing,trl,trl_checkpointing,disk", "--rounds", "2", "--no-noise", "--soak-steps",
                          "2", "--steps", "1", "--warmup", "1", "--min-bytes", "0", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "activations_cpu.json").read_text())
    order = [(r["round"], r["variant"]) for r in result["runs"]]
    assert order == [(1, "none"), (1, "all"), (1, "hidden_states"), (1, "checkpointing"), (1, "trl"),
                     (1, "trl_checkpointing"), (1, "disk"), (2, "disk"), (2, "trl_checkpointing"), (2, "trl"),
                     (2, "checkpointing"), (2, "hidden_states"), (2, "all"), (2, "none")]
    assert all("step_s" in r for r in result["runs"])
    assert all(r["d2h_GB_per_step"] > 0 for r in result["runs"] if r["variant"] == "all")
    # The disk tier's figures cover the measured steps only, though its counters also hold the warm-up's.
    for disk in (r for r in result["runs"] if r["variant"] == "disk"):
        assert disk["disk_written_GB_per_step"] == pytest.approx(disk["d2h_GB_per_step"])
        assert disk["disk_checksum_ms_per_step"] > 0 and disk["disk_read_wait_ms_per_step"] > 0
        assert disk["disk_create_ms_per_step"] > 0 and disk["disk_close_ms_per_step"] > 0
    assert "`all` step / TRL step" in run.stdout and "`all` step / TRL with checkpointing step" in run.stdout
    assert "`hidden_states` step / TRL with checkpointing step" in run.stdout
    assert ", 2 rounds" in run.stdout and result["soak"]["steps"] == 2
    # Every variant against plain training and against checkpointing, per round, in the record and
    # the printed table.
    for baseline in ("none", "checkpointing"):
        lines = {line.split("`")[1]: line for line in result[f"against_{baseline}"]}
        assert set(lines) == {"none", "all", "hidden_states", "checkpointing", "trl", "trl_checkpointing",
                              "disk"} - {baseline}
        assert all(line.startswith("seq 64: ") and line.endswith(", 2 rounds") for line in lines.values())
        assert lines["trl_checkpointing"] in run.stdout


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


def test_bench_compile_shared_cache_reuses_the_compiled_graphs_which_still_offload(tmp_path):
    # --compile-cache: the second process takes ours' compiled graphs from the first one's caches
    # (nothing is partitioned in it), they still offload, and no compile time is reported.
    cache = tmp_path / "cache"
    runs = []
    for index in range(2):
        out = tmp_path / f"run{index}"
        run = subprocess.run([sys.executable, "benchmarks/bench_compile.py", "--device", "cpu", "--tiny", "--seqs",
                              "32", "--steps", "1", "--variants", "ours_compiled", "--compile-cache", str(cache),
                              "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
        (row,) = json.loads((out / "compile_cpu.json").read_text())["runs"]
        runs.append(row)
    assert any(cache.iterdir())
    first, second = runs
    assert first["offloaded_per_graph"][0] >= 2 and "offloaded_per_graph" not in second
    assert second["d2h_GB_per_step"] == first["d2h_GB_per_step"] > 0
    assert "compile_s" not in first and "compile_s" not in second


def test_rounds_runs_each_variant_in_its_own_process_in_alternated_order(tmp_path):
    # benchmarks/rounds.py around a benchmark: one process per variant and round, the order reversed
    # in the second round, and each round's ratio against the baseline of the same round.
    run = subprocess.run([sys.executable, "benchmarks/rounds.py", "--rounds", "2", "--baseline", "ckpt", "--out",
                          str(tmp_path), "--", sys.executable, "benchmarks/bench_selective.py", "--device", "cpu",
                          "--tiny", "--seqs", "64", "--variants", "ckpt,hidden", "--steps", "1", "--warmup", "1"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "rounds.json").read_text())
    assert [(r["round"], r["variant"]) for r in result["runs"]] == [(1, "ckpt"), (1, "hidden"), (2, "hidden"),
                                                                    (2, "ckpt")]
    assert sorted(p.name for p in (tmp_path / "round2").iterdir()) == ["ckpt", "hidden"]
    step = {(r["round"], r["variant"]): r["step_s"] for r in result["runs"]}
    hidden = next(r for r in result["summary"] if r["variant"] == "hidden")
    ratios = sorted(step[(n, "ckpt")] / step[(n, "hidden")] for n in (1, 2))
    assert hidden["rounds"] == 2 and hidden["speed_x_baseline"]["min"] == pytest.approx(ratios[0])
    assert hidden["speed_x_baseline"]["max"] == pytest.approx(ratios[1])
    assert "| 64 | hidden | 2 |" in run.stdout and not result["failed"]
    # Each run keeps the script's own row and the rest of its JSON, for what bounds a figure.
    first = result["runs"][0]
    assert first["row"]["variant"] == "ckpt" and first["row"]["step_s"] == first["step_s"]
    assert first["script_output"]["config"]["layers"] >= 1 and "runs" not in first["script_output"]
    assert result["torch"] == first["script_output"]["torch"] and result["gpu"] == first["script_output"]["gpu"]
    assert result["date"] == first["script_output"]["date"][:10] and "reversed in even rounds" in result["order"]


def test_rounds_resume_keeps_the_finished_rounds_and_runs_a_round_cut_short_again(tmp_path):
    wrapped = [sys.executable, "benchmarks/bench_selective.py", "--device", "cpu", "--tiny", "--seqs", "64",
               "--variants", "ckpt,hidden", "--steps", "1", "--warmup", "0"]

    def rounds(*extra):
        return subprocess.run([sys.executable, "benchmarks/rounds.py", "--baseline", "ckpt", "--out", str(tmp_path),
                               *extra, "--", *wrapped], capture_output=True, text=True, cwd=REPO, timeout=600)

    assert rounds("--rounds", "1").returncode == 0
    # As if a time limit stopped round 2 after its first variant:
    path = tmp_path / "rounds.json"
    first = json.loads(path.read_text())
    path.write_text(json.dumps({**first, "runs": first["runs"] + [{**first["runs"][1], "round": 2}]}))
    run = rounds("--rounds", "3", "--resume")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "resuming: rounds [1] kept" in run.stdout and "round 1 " not in run.stdout
    result = json.loads(path.read_text())
    assert result["runs"][:2] == first["runs"]  # round 1 as it was
    assert [(r["round"], r["variant"]) for r in result["runs"][2:]] == [(2, "hidden"), (2, "ckpt"), (3, "ckpt"),
                                                                        (3, "hidden")]
    hidden = next(r for r in result["summary"] if r["variant"] == "hidden")
    assert hidden["rounds"] == 3 and result["rounds"] == 3 and result["rounds_kept_from_earlier"] == [1]
    other = [w if w != "ckpt,hidden" else "ckpt,all" for w in wrapped]
    refused = subprocess.run([sys.executable, "benchmarks/rounds.py", "--baseline", "ckpt", "--out", str(tmp_path),
                              "--resume", "--", *other], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert refused.returncode != 0 and "holds rounds of another command" in refused.stderr
    assert json.loads(path.read_text()) == result  # left as it was


def test_rounds_wraps_the_package_bench_by_its_modes_and_json(tmp_path):
    # python -m torch_offload.bench names its variants --modes and writes --json: each round's run of
    # one mode writes its own JSON, an alias ("true" is "all") is kept under the name the user gave.
    wrapped = [sys.executable, "-m", "torch_offload.bench", "--device", "cpu", "--seqs", "64", "--steps", "1",
               "--warmup", "0", "--no-progress"]
    run = subprocess.run([sys.executable, "benchmarks/rounds.py", "--rounds", "2", "--baseline", "checkpointing",
                          "--out", str(tmp_path), "--", *wrapped, "--modes", "checkpointing,true"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "rounds.json").read_text())
    assert [(r["round"], r["variant"]) for r in result["runs"]] == [(1, "checkpointing"), (1, "true"), (2, "true"),
                                                                    (2, "checkpointing")]
    assert all(r["step_s"] > 0 for r in result["runs"]) and not result["failed"]
    assert json.loads((tmp_path / "round2" / "true" / "result.json").read_text())["runs"][0]["variant"] == "all"
    assert next(r for r in result["summary"] if r["variant"] == "true")["rounds"] == 2
    for modes, extra, why in [("checkpointing,modules:qkv,core_attn", [], "modules: variant is not supported"),
                              ("checkpointing,all", ["--json", "x.json"], "leave --json out")]:
        refused = subprocess.run([sys.executable, "benchmarks/rounds.py", "--baseline", "checkpointing", "--out",
                                  str(tmp_path / "refused"), "--", *wrapped, *extra, "--modes", modes],
                                 capture_output=True, text=True, cwd=REPO, timeout=60)
        assert refused.returncode != 0 and why in refused.stderr and not (tmp_path / "refused").exists()


def test_rounds_wraps_a_torchrun_launch_one_process_group_per_variant(tmp_path):
    # The FSDP2 benchmarks run under torchrun: rounds.py launches one torchrun per variant and round
    # and takes the row that rank 0 wrote (the worse rank's step).
    wrapped = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "benchmarks/bench_fsdp2.py", "--device", "cpu", "--tiny", "--seqs", "64", "--warmup", "0", "--steps", "1"]
    run = subprocess.run([sys.executable, "benchmarks/rounds.py", "--rounds", "2", "--baseline", "ckpt", "--out",
                          str(tmp_path), "--", *wrapped, "--variants", "ckpt,hs_after"],
                         capture_output=True, text=True, cwd=REPO, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "rounds.json").read_text())
    assert [(r["round"], r["variant"]) for r in result["runs"]] == [(1, "ckpt"), (1, "hs_after"), (2, "hs_after"),
                                                                    (2, "ckpt")]
    for r in result["runs"]:
        assert len(r["row"]["per_rank"]) == 2 and r["step_s"] == max(p["step_s"] for p in r["row"]["per_rank"])
    assert result["runs"][0]["script_output"]["world_size"] == 2
    assert next(r for r in result["summary"] if r["variant"] == "hs_after")["rounds"] == 2 and not result["failed"]


def test_rounds_reports_a_variant_that_fails_and_refuses_a_missing_baseline(tmp_path):
    wrapped = [sys.executable, "benchmarks/bench_selective.py", "--device", "cpu", "--tiny", "--seqs", "64",
               "--steps", "1", "--warmup", "0"]
    run = subprocess.run([sys.executable, "benchmarks/rounds.py", "--rounds", "1", "--baseline", "ckpt", "--out",
                          str(tmp_path), "--", *wrapped, "--variants", "ckpt,nope"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 1
    failed = json.loads((tmp_path / "rounds.json").read_text())["failed"]
    assert len(failed) == 1 and failed[0].startswith("round 1 nope: exit 2") and "unknown variant" in failed[0]
    refused = subprocess.run([sys.executable, "benchmarks/rounds.py", "--baseline", "ckpt", "--out", str(tmp_path),
                              "--", *wrapped, "--variants", "hidden"], capture_output=True, text=True, cwd=REPO)
    assert refused.returncode == 2 and "--baseline 'ckpt' is not among" in refused.stderr
