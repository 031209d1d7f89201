#!/bin/bash
# Session 9: the scripts of each device call, in order (run from the repository root with OUT set; .gpu/ is not committed).

# --- s9call1.sh (nvidia-h100-x1)
# Session 9, call 1 (H100): session 8's disk direct IO on the GPU machine. The C++ suite with CUDA;
# the CUDA pytest cases touched since the last GPU run; the page cache's cost on this machine's disk;
# the bench CLI's disk variants (page cache and direct IO) beside checkpointing at 32k and 64k.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; free -g | head -2; df -h /tmp | tail -1
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:$LD_LIBRARY_PATH
(timeout 150 build/tests/torch_offload_tests --gtest_brief=1 2>&1 | tail -25) > $OUT/cpp_tests_cuda_h100.log; tail -4 $OUT/cpp_tests_cuda_h100.log
(cd python_tests && timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_disk_direct_io.py test_auto_tail.py test_keep_on_device.py test_auto.py test_chunked_loss.py 2>&1 | tail -15) > $OUT/pytest_cuda_session9.log; tail -3 $OUT/pytest_cuda_session9.log
timeout 100 python3 benchmarks/disk_page_cache.py --dir /tmp/pc --tensors 32 --mb 128 --rounds 2 --json $OUT/disk_page_cache_h100.json > $OUT/disk_page_cache_h100.log 2>&1; tail -12 $OUT/disk_page_cache_h100.log
timeout 240 python3 -m torch_offload.bench --modes checkpointing,hidden_states,hidden_states_disk,hidden_states_disk_direct --seqs 32768,65536 --steps 4 --warmup 1 --disk-dir /tmp --json $OUT/bench_cli_disk_direct_h100.json > $OUT/bench_cli_disk_direct_h100.log 2>&1; echo rc=$?; tail -25 $OUT/bench_cli_disk_direct_h100.log

# --- s9call2.sh (nvidia-h100-x1)
# Session 9, call 2 (H100): the two CUDA tests that failed in call 1 after their fixes (pinned buffers
# page-aligned for direct IO; auto's extra tail trials), the C++ CUDA transfer tests; then issue 8:
# inductor's generated code of compiled selective at 16k beside its peak's allocating lines.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib:$LD_LIBRARY_PATH
timeout 60 build/tests/torch_offload_tests --gtest_brief=1 --gtest_filter='CudaTransfer*:*Direct*' 2>&1 | tail -4
(cd python_tests && timeout 120 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_disk_direct_io.py test_auto.py 2>&1 | tail -8) > $OUT/pytest_cuda_fixed.log; tail -3 $OUT/pytest_cuda_fixed.log
rm -rf /tmp/torchinductor_*
TORCH_LOGS=output_code timeout 380 python3 benchmarks/peak_memory.py --out /tmp/pm --layers 24 --seqs 16384 --top 40 --variants ours_selective_compiled > /tmp/code.log 2>&1
echo rc=$?; grep -E "^===|\[|-- |allocated GB at" /tmp/code.log | cut -c1-300 | tail -60
gzip -c /tmp/code.log > $OUT/selective_compiled_output_code_16k_h100.log.gz
cp /tmp/pm/peak_memory.json $OUT/selective_compiled_output_code_16k_h100.json
ls -la $OUT

# --- s9call3.sh (nvidia-h100-x1)
# Session 9, call 3 (H100): issue 8, compiled checkpointing's generated backward at 16k, to compare
# with compiled selective's (call 2): which large buffers each holds through its backward.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/torchinductor_*
TORCH_LOGS=output_code timeout 300 python3 benchmarks/peak_memory.py --out /tmp/pm --layers 24 --seqs 16384 --top 40 --variants ckpt_compiled > /tmp/code.log 2>&1
echo rc=$?; grep -E "^===|\[|-- |allocated GB at" /tmp/code.log | cut -c1-300 | tail -30
gzip -c /tmp/code.log > $OUT/ckpt_compiled_output_code_16k_h100.log.gz
cp /tmp/pm/peak_memory.json $OUT/ckpt_compiled_output_code_16k_h100.json

# --- s9call4.sh (nvidia-h100-x1)
# Session 9, call 4 (H100): every CUDA pytest case at the session's code (pinned alignment, the
# disk_io split, apply(chunked_loss={...})); then modules `*.self_attn` at 4k and 16k, 3 rounds.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python_tests && timeout 300 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda . 2>&1 | tail -15) > $OUT/gpu_pytest_cuda_h100_session9_all.log; tail -4 $OUT/gpu_pytest_cuda_h100_session9_all.log
timeout 250 python3 benchmarks/bench_modules.py --out /tmp/mod --seqs 4096,16384 --steps 5 --rounds 3 > $OUT/modules_session9_h100.log 2>&1; echo rc=$?; tail -12 $OUT/modules_session9_h100.log | cut -c1-400
cp /tmp/mod/*.md /tmp/mod/*.json $OUT/ 2>/dev/null; ls $OUT

# --- s9call5.sh (nvidia-h100-x1)
# Session 9, call 5 (H100): issue 8 after turning inductor's buffer reuse off in torch_offload.compile:
# compiled checkpointing, ours hidden_states and ours selective at 16k in one process (peak allocated,
# tok/s, compile time); then the CUDA cases of test_compile.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/torchinductor_*
timeout 330 python3 benchmarks/bench_compile.py --out /tmp/c16 --seqs 16384 --variants ckpt_compiled,ours_compiled,ours_selective --steps 3 > $OUT/compile_no_buffer_reuse_16k_h100.log 2>&1; echo rc=$?
tail -12 $OUT/compile_no_buffer_reuse_16k_h100.log | cut -c1-300
cp /tmp/c16/*.md /tmp/c16/*.json $OUT/ 2>/dev/null
(cd python_tests && timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_compile.py 2>&1 | tail -6) > $OUT/pytest_cuda_compile.log; tail -2 $OUT/pytest_cuda_compile.log
ls $OUT

# --- s9call6.sh (nvidia-h100-x1)
# Session 9, call 6 (H100): issue 8, compiled hidden_states at 16k after the buffer-reuse change: the
# live allocations at its step peak and inductor's generated code (to read with
# benchmarks/results/compiled_backward_liveness.py).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/torchinductor_*
TORCH_LOGS=output_code timeout 250 python3 benchmarks/peak_memory.py --out /tmp/pm --layers 24 --seqs 16384 --top 40 --variants ours_compiled > /tmp/code.log 2>&1
echo rc=$?; grep -E "^===|\[|-- |allocated GB at" /tmp/code.log | cut -c1-300 | tail -20
gzip -c /tmp/code.log > $OUT/hidden_states_compiled_output_code_16k_h100.log.gz
cp /tmp/pm/peak_memory.json $OUT/hidden_states_compiled_output_code_16k_h100.json

# --- s9call7.sh (nvidia-h100-x1)
# Session 9, call 7 (H100): issue 8 experiment: inductor fuses the rotary kernels of two layers
# (they read the same cos/sin buffer), which pulls the next layer's recompute (norm, k/v projections)
# into this layer's backward. Same run as call 5 with score_fusion_memory_threshold = 32 MiB in our
# graphs' options (fusions sharing less than that are skipped); compiled checkpointing is call 5's.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/torchinductor_*
timeout 240 python3 - > $OUT/compile_fusion_threshold_16k_h100.log 2>&1 <<'PY'
import runpy, sys
import torch_offload, sys as _s
c = _s.modules["torch_offload.compile"]
original = c._inductor_options
def with_threshold(*args, **kwargs):
    merged = original(*args, **kwargs)
    merged["score_fusion_memory_threshold"] = 32 << 20
    return merged
c._inductor_options = with_threshold
sys.argv = ["bench_compile.py", "--out", "/tmp/cf", "--seqs", "16384", "--variants", "ours_compiled,ours_selective", "--steps", "3"]
runpy.run_path("benchmarks/bench_compile.py", run_name="__main__")
PY
echo rc=$?; tail -12 $OUT/compile_fusion_threshold_16k_h100.log | cut -c1-300
cp /tmp/cf/compile_h100.md $OUT/compile_fusion_threshold_16k_h100.md; cp /tmp/cf/compile_h100.json $OUT/compile_fusion_threshold_16k_h100.json
