# Session 21 (2026-11-25): the GPU calls, in order; each ran as `bash .gpu/s21callN.sh` on nvidia-h100-x1 with carry
# [build/libtorch_offload.so, build/_save_hooks.cpython-312-x86_64-linux-gnu.so, .gpu]. The library was built here
# (cmake --build build) and the Python 3.12 save hooks with
#   cmake -S . -B /tmp/build-py312 -G Ninja -DPython3_EXECUTABLE=/root/.pyenv/versions/3.12.1/bin/python3 \
#     -DTorch_DIR=$HOME/.cache/torch_offload/venv/lib/python3.11/site-packages/torch/share/cmake/Torch \
#     -DTORCH_OFFLOAD_BUILD_TESTS=OFF -DTORCH_OFFLOAD_BUILD_EXAMPLES=OFF
#   cmake --build /tmp/build-py312 --target torch_offload_save_hooks
# then copied to build/ and both stripped of debug info (strip --strip-debug).
# Calls 1: 14c5a76's code (session 19's library). Calls 2-5: that code with the experiment switches of
# session21_experiment_switches.patch (write-combined host memory, a polling releaser, cudaMemcpyBatchAsync,
# 4 KB copies), not kept. Call 6: the deferred saves (pyext/deferred_saves.h), before held leaves and the
# batched memcpy. Calls 7, 9, 11: the final code; call 8: it with session21_save_path_phases.patch; call 10 ran
# directly, building everything on the GPU machine; call 12: the final code with session21_background_worker.patch;
# call 13: 210a1e3's code (the final library and hooks); its modules_h100.{md,json} -> modules_final3_session21_h100.{md,json}. Each call landed on a fresh machine (the lease's `warm` was false).
# Logs kept under their $OUT names; call 7's modules_h100.{md,json} -> modules_session21_h100.{md,json}, call 11's ->
# modules_4k_final2_session21_h100.{md,json}; call 10's summary.txt / ctest.log / pytest.log -> gpu_check_session21_summary.txt,
# gtest_h100_session21.log, gpu_pytest_cuda_h100_session21.log.

### call 1
# Session 21, call 1 (H100): the 4k modules step's host time split inside / outside the self_attn calls.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nproc; lscpu | grep -E "Model name|Thread|Core|Socket" ; python3 --version
python3 benchmarks/results/modules_host_split_4k.py 4096 40 2>&1 | tee $OUT/modules_host_split_4k_session21_h100.log

### call 2
# Session 21, call 2 (H100): write-combined host memory for modules' copies (experiment build).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 benchmarks/results/modules_host_split_4k.py 4096 40 plain,modules,modules_wc,modules_keep 2>&1 | grep -v Warn | tee $OUT/modules_host_split_wc_4k_session21_h100.log

### call 3
# Session 21, call 3 (H100): the save hooks' own host time inside the 4k modules step; write-combined again.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 benchmarks/results/modules_host_split_4k.py 4096 50 plain,modules,modules_timed,modules_keep_timed,modules_wc 2>&1 | grep -v Warn | tee $OUT/modules_host_split_timed_4k_session21_h100.log

### call 4
# Session 21, call 4 (H100): experiment switches against the 4k modules step (polling releaser,
# batched memcpy, write-combined host memory), step by step in one process.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 benchmarks/results/modules_host_split_4k.py 4096 50 plain,modules,modules_poll,modules_bm,modules_bmo,modules_wc,modules_wc_poll_bm,modules_keep 2>&1 | grep -v Warn | tee $OUT/modules_host_split_switches_4k_session21_h100.log

### call 5
# Session 21, call 5 (H100): the 4k modules step with the link's traffic taken out (4 KB per copy,
# timing only), and the batch's copies in one cudaMemcpyBatchAsync, their hooks timed.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 benchmarks/results/modules_host_split_4k.py 4096 60 plain,modules_timed,modules_tiny_timed,modules_bm_timed,modules_keep_timed 2>&1 | grep -v Warn | tee $OUT/modules_host_split_tiny_4k_session21_h100.log

### call 6
# Session 21, call 6 (H100): deferred saves (C hooks hold a selected call's saves until its end) against
# the engine's batch alone, 4k modules, host time split; then the CUDA tests of the touched files.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 benchmarks/results/modules_host_split_4k.py 4096 60 plain,modules,modules_nodefer,modules_timed,modules_nodefer_timed 2>&1 | grep -v Warn | tee $OUT/modules_host_split_deferred_4k_session21_h100.log
python3 -m pytest -q -m cuda python_tests/test_deferred_saves.py python_tests/test_modules.py python_tests/test_save_hooks_c.py python_tests/test_activations_dedup.py 2>&1 | tail -5 | tee $OUT/gpu_pytest_cuda_h100_session21_call6.log

### call 7
# Session 21, call 7 (H100): deferred saves + batched memcpy (the final code) against the engine's
# batch alone, 4k step by step; then bench_modules' own rounds at 4k and 16k.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 benchmarks/results/modules_host_split_4k.py 4096 60 plain,modules,modules_nodefer,modules_keep 2>&1 | grep -v Warn | tee $OUT/modules_host_split_final_4k_session21_h100.log
timeout 420 python3 benchmarks/bench_modules.py --out $OUT --seqs 4096,16384 --steps 5 --rounds 7 2>&1 | tail -30 | tee $OUT/bench_modules_session21_h100.log

### call 8
# Session 21, call 8 (H100): the save path's phases timed inside the 4k modules step (phase_timer.h,
# experiment build, not kept), printed at exit; only plain training and modules run.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 benchmarks/results/modules_host_split_4k.py 4096 40 plain,modules 2>&1 | grep -v Warn | tee $OUT/save_path_phases_4k_session21_h100.log

### call 9
# Session 21, call 9 (H100): the in-flight bound for modules' batches (call 8: a call's end waited 0.7 ms
# per step on max_in_flight=4, its batches being 5 copies), 4k step by step; the 16k peak with each.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 benchmarks/results/modules_host_split_4k.py 4096 60 plain,modules,modules_mif8,modules_mif16 2>&1 | grep -v Warn | tee $OUT/modules_host_split_mif_4k_session21_h100.log
python3 benchmarks/results/stepwise_models_issue10.py 16384 6 plain,modules,modules_mif8,modules_mif16 2>&1 | grep -v Warn | tee $OUT/stepwise_modules_mif_16k_session21_h100.log

### call 10 (run directly, building everything on the GPU machine)
SKIP_BENCH=1 bash benchmarks/gpu_check.sh $OUT > $OUT/gpu_check_session21.log 2>&1

### call 11
# Session 21, call 11 (H100): the final code on another machine: 4k step by step, and bench_modules' rounds at 4k.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 benchmarks/results/modules_host_split_4k.py 4096 60 plain,modules,modules_keep 2>&1 | grep -v Warn | tee $OUT/modules_host_split_final2_4k_session21_h100.log
timeout 300 python3 benchmarks/bench_modules.py --out $OUT --seqs 4096 --steps 5 --rounds 7 2>&1 | tail -8 | tee $OUT/bench_modules_4k_final2_session21_h100.log

### call 12
# Session 21, call 12 (H100): the held saves handed to a worker thread (background) against the same
# on the forward's thread, 4k step by step (timed too); the CUDA cases of the touched test files.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 benchmarks/results/modules_host_split_4k.py 4096 60 plain,modules,modules_bg,modules_timed,modules_bg_timed 2>&1 | grep -v Warn | tee $OUT/modules_host_split_background_4k_session21_h100.log
python3 -m pytest -q -m cuda python_tests/test_deferred_saves.py python_tests/test_modules.py python_tests/test_save_hooks_c.py 2>&1 | tail -3 | tee $OUT/gpu_pytest_cuda_h100_session21_call12.log

### call 13
# Session 21, call 13 (H100): the final code: the CUDA cases of the held saves' test files, and
# bench_modules' rounds at 4k and 16k.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pytest -q -m cuda python_tests/test_deferred_saves.py python_tests/test_modules.py python_tests/test_save_hooks_c.py python_tests/test_activations_dedup.py 2>&1 | tail -3 | tee $OUT/gpu_pytest_cuda_h100_session21_call13.log
timeout 400 python3 benchmarks/bench_modules.py --out $OUT --seqs 4096,16384 --steps 5 --rounds 5 2>&1 | tail -9 | tee $OUT/bench_modules_final3_session21_h100.log
