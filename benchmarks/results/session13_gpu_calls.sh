#!/usr/bin/env bash
# Session 13's GPU calls (nvidia-h100-x1), in order; each ran as `bash .gpu/s13callN.sh $OUT` (the
# scripts set TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD). Device calls 3 and 4
# both ran s13call3.sh (the second with per-step times and the modules_nogc variant).
OUT=${1:?}

# ---- .gpu/s13call1.sh
# Session 13, call 1: where modules `*.self_attn` loses its time at 4k (issue 13): plain, bare
# Python hooks on the same modules, modules, modules with no copies, modules unbounded; 5 rounds.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
timeout 300 python3 benchmarks/results/modules_decompose_4k.py 4096 5 2>&1 | tee $OUT/modules_decompose_4k_h100.log | grep -v Warning

# ---- .gpu/s13call2.sh
# (The script was then benchmarks/results/modules_trace_4k.py recording CPU and CUDA activity; it is
# step_trace.py now and records CUDA activity only, so this call's figures, distorted by the
# profiler's host cost, are not what today's script gives.)
# Session 13, call 2: the GPU timeline of one 4k step, plain / modules with no copies / modules
# (issue 13): compute-stream gaps per phase, copy-stream busy time; traces gzipped to OUT/traces.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/results/step_trace.py $OUT/traces 4096 2>&1 | grep -v -i "warn" | tee $OUT/modules_trace_4k_h100.log

# ---- .gpu/s13call3.sh
# Session 13, call 3: a 4k step's forward and backward timed apart (no profiler), plain / modules
# with no copies / modules, 4 rounds (issue 13).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/results/modules_phases_4k.py 4096 4 2>&1 | grep -v -i "warn" | tee $OUT/modules_phases_4k_h100.log

# ---- .gpu/s13call4.sh
# Session 13, call 4: the save filter in the engine (1afeb6d) against the build before it (ae429ae,
# .gpu/old: its library and Python tree), modules `*.self_attn` at 4k in alternating processes, each
# against plain training in the same process; then the new build's 4k decomposition with a deeper
# prefetch; then the C++ tests with CUDA and the save-hook files' CUDA cases.
export PYTHONUNBUFFERED=1
ROOT=$PWD
new() { TORCH_OFFLOAD_LIBRARY=$ROOT/build/libtorch_offload.so PYTHONPATH=$ROOT "$@"; }
old() { (cd .gpu/old && TORCH_OFFLOAD_LIBRARY=$PWD/libtorch_offload.so PYTHONPATH=$PWD "$@"); }
for i in 1 2 3; do
  old timeout 100 python3 benchmarks/bench_modules.py --out $OUT/old$i --seqs 4096 --steps 5 --rounds 3 2>&1 | grep -E "^\| 4096" | head -2
  new timeout 100 python3 benchmarks/bench_modules.py --out $OUT/new$i --seqs 4096 --steps 5 --rounds 3 2>&1 | grep -E "^\| 4096" | head -2
done
new timeout 200 python3 benchmarks/results/modules_decompose_4k.py 4096 4 2>&1 | grep -v -i warn | tee $OUT/modules_decompose_4k_filter_h100.log | grep -v '^ *"\(host_wait\|compute_wait\|bytes_to\|saves\|saved_tensors\|offloaded_saves\|shared_saves\|kept_saves\|bytes_kept\)'
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$LD_LIBRARY_PATH
timeout 150 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100_session13.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest_h100_session13.log
(cd python_tests && new timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_save_filter.py test_activations_dedup.py test_activations.py test_modules.py test_module_presets.py test_keep_on_device.py test_layers.py 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session13_call4.log | tail -3)

# ---- .gpu/s13call5.sh
# (step_trace.py was then modules_trace_4k.py: CUDA activity only, variants named none / nocopy /
# modules, today's none,modules_nocopy,modules.)
# Session 13, call 5: the GPU timeline of a 4k step with CUDA activity only (plain / modules with no
# copies / modules), the 4k decomposition again with the filter build (bare hooks fixed) and a deeper
# prefetch (issue 13); hidden_states at 16k in 5 interleaved rounds (issue 10).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/results/step_trace.py $OUT/traces 4096 2>&1 | grep -v -i "warn" | tee $OUT/modules_trace_4k_cuda_only_h100.log
timeout 200 python3 benchmarks/results/modules_decompose_4k.py 4096 4 2>&1 | grep -v -i warn | tee $OUT/modules_decompose_4k_filter_h100.log | grep -v '^ *"\(host_wait\|bytes_to\|saves\|saved_tensors\|offloaded_saves\|shared_saves\|kept_saves\|bytes_kept\)'
timeout 200 python3 benchmarks/bench_selective.py --out $OUT/sel --seqs 16384 --rounds 5 --steps 3 --warmup 1 --variants ckpt,hidden,hidden#1 2>&1 | grep -E "^\| 16384" | head -4

# ---- .gpu/s13call6.sh
# Session 13, call 6: host time per save-hook op call in a 4k modules step (issue 13); GPU timelines
# (CUDA activity only) of checkpointing and hidden_states at 16k (issue 10).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 120 python3 benchmarks/results/modules_pack_cost_4k.py 4096 10 2>&1 | grep -v -i warn | tee $OUT/modules_pack_cost_4k_h100.log
timeout 200 python3 benchmarks/results/step_trace.py $OUT/traces 16384 ckpt,hidden,hidden_nocopy 2>&1 | grep -v -i "warn" | tee $OUT/hidden_trace_16k_h100.log

# ---- .gpu/s13call7.sh
# Session 13, call 7 (carry .whl for py-spy): native stacks of a 4k modules training loop with the
# save filter in the engine, to split the copy pack's ~35 us of host time (issue 13).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index .whl/py_spy-*.whl 2>&1 | grep -v WARNING | tail -1
python3 benchmarks/results/modules_loop_4k.py 400 &
sleep 20
timeout 60 py-spy record --native --format raw --rate 50 -d 25 -o $OUT/modules_4k_filter_pyspy.txt --pid $! 2>&1 | tail -3
wait
gzip $OUT/modules_4k_filter_pyspy.txt

# ---- .gpu/s13call8.sh
# Session 13, call 8: modules `*.self_attn` with prefetch_depth 4 (the default), 8, 16, 32 at 4k
# and 16k, 4 interleaved rounds (issue 13: the 4k trace shows each layer's first restore issued on
# demand, not prefetched).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 400 python3 benchmarks/bench_modules.py --out $OUT/mod --seqs 4096,16384 --steps 5 --rounds 4 --prefetch-depths 4,8,16,32 2>&1 | grep -E "^\| (4096|16384)" | head -10

# ---- .gpu/s13call9.sh
# Session 13, call 9 (carry .whl for TRL): the final build (save filter in the engine, modules
# prefetching 8 ahead): modules `*.self_attn` at 4k / 16k in 5 rounds; `all` at 16k beside TRL;
# bf16 gradients of all and modules against the noise floor at 4k (issue 13).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
timeout 170 python3 benchmarks/bench_modules.py --out $OUT/mod --seqs 4096,16384 --steps 5 --rounds 5 2>&1 | grep -E "^\| (4096|16384)" | head -6
timeout 200 python3 benchmarks/bench_activations.py --out $OUT/act --seqs 16384 --variants none,all,trl --no-noise --soak-steps 2 --warmup 1 --steps 3 2>&1 | grep -E "^\| 16384|TRL|distinct" | head -8
timeout 150 python3 benchmarks/bench_activations.py --out $OUT/noise --seqs 4096 --variants none,all,modules --steps 3 --warmup 1 --soak-steps 2 2>&1 | grep -E "^\| 4096|noise|floor" | head -10

# ---- .gpu/s13call10.sh
# Session 13, call 10: every CUDA pytest case on the final build (the save filter changes the save
# path of all, sync, disk and modules, and selective's hooks).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
(cd python_tests && timeout 420 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda . 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session13_final.log | tail -5)

# ---- .gpu/s13call11.sh (clocks_16k_windows.jsonl is committed as clocks_16k_windows_h100.jsonl)
# Session 13, call 11 (issue 10): the GPU's SM clock, power and clock-event reasons during
# interleaved 16k steps of checkpointing / hidden_states / hidden_states without copies.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
F=clocks_event_reasons.active
nvidia-smi --query-gpu=$F --format=csv,noheader > /dev/null 2>&1 || F=clocks_throttle_reasons.active
nvidia-smi --query-gpu=power.limit,clocks.max.sm --format=csv
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,$F --format=csv,noheader -lms 100 > $OUT/clocks_16k_smi.csv &
SMI=$!
timeout 300 python3 benchmarks/results/clocks_16k.py 16384 4 > $OUT/clocks_16k_windows.jsonl 2> $OUT/clocks_16k_stderr.log
kill $SMI
tail -3 $OUT/clocks_16k_stderr.log
python3 benchmarks/results/clocks_16k_analyse.py $OUT/clocks_16k_windows.jsonl $OUT/clocks_16k_smi.csv | tee $OUT/clocks_16k_h100.log
head -3 $OUT/clocks_16k_smi.csv
gzip $OUT/clocks_16k_smi.csv

# ---- .gpu/s13call12.sh (.gpu/poll/libtorch_offload.so: 32e5f72 with CudaFence::synchronize polling event.query() every 20 us, built in a worktree, not committed)
# Session 13, call 12 (issue 13): copy fences that poll (query + 20 us sleeps, .gpu/poll: the final
# build with that one change in csrc/cuda_transfer.cpp) against the final build's fences, which
# spin inside cudaEventSynchronize on the releaser thread: the host time per save-op call and the
# 4k modules step, in alternating processes.
export PYTHONUNBUFFERED=1
ROOT=$PWD
run() { TORCH_OFFLOAD_LIBRARY=$1 PYTHONPATH=$ROOT "${@:2}"; }
summary() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d['step_ms'], {k: (v['median_us'], v['p90_us'], v['ms_per_step']) for k, v in d['calls'].items()})"; }
for i in 1 2 3; do
  for build in spin poll; do
    lib=$ROOT/build/libtorch_offload.so; [ $build = poll ] && lib=$ROOT/.gpu/poll/libtorch_offload.so
    echo "== $build $i"
    run $lib timeout 100 python3 benchmarks/results/modules_pack_cost_4k.py 4096 10 2>/dev/null | summary
    run $lib timeout 100 python3 benchmarks/bench_modules.py --out $OUT/$build$i --seqs 4096 --steps 5 --rounds 3 2>&1 | grep -E "^\| 4096" | head -2
  done
done

# ---- .gpu/s13call13.sh
# Session 13, call 13 (issue 13): host time per CUDA call of a copying save, with the GPU busy, to
# size a copy launcher off the forward thread.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/cuda_call_cost.py 200 2>&1 | grep -v -i warn | tee $OUT/cuda_call_cost_h100.log

# ---- .gpu/s13call14.sh (carry build/tests/torch_offload_tests too)
# Session 13, call 14: after the review (d0feff1: one record of offloaded storages in the engine),
# the C++ tests with CUDA and the save-hook files' CUDA cases.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$LD_LIBRARY_PATH
timeout 150 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100_session13_review.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest_h100_session13_review.log
(cd python_tests && timeout 250 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_save_filter.py test_activations_dedup.py test_activations.py test_modules.py test_module_presets.py test_keep_on_device.py test_layers.py test_fsdp2.py 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session13_review.log | tail -3)
