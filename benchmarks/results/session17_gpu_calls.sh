# Session 17 (2026-11-24): the GPU calls, in order; each ran as `bash .gpu/s17callN.sh $OUT` on nvidia-h100-x1
# with carry [build/libtorch_offload.so, build/_save_hooks.cpython-312-x86_64-linux-gnu.so (built here against
# /root/.pyenv/versions/3.12.1, as in session 16), .gpu] (+ the py-spy wheel in call 6, the trl 1.16.0 wheel in call 7).
# Call 2's library was built with session17_batch_emulation.patch (not kept; inert unless TORCH_OFFLOAD_EXP_BATCH is set);
# call 3's .gpu/bin/torch_offload_tests is build/tests/torch_offload_tests of e231db3, stripped of debug info.

### call 1
# Session 17, call 1: modules mode with backward's first restores prefetched (Python change only).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python_tests && timeout 150 python3 -m pytest -q -m cuda test_first_restores.py test_modules.py > $OUT/gpu_pytest_cuda_h100_session17_call1.log 2>&1; tail -3 $OUT/gpu_pytest_cuda_h100_session17_call1.log)
timeout 150 python3 benchmarks/results/modules_first_restores_4k.py 4096 40 > $OUT/modules_first_restores_4k_h100.log 2>&1; grep -v -i warn $OUT/modules_first_restores_4k_h100.log | tail -8
timeout 200 python3 benchmarks/results/modules_first_restores_4k.py 16384 12 > $OUT/modules_first_restores_16k_h100.log 2>&1; grep -v -i warn $OUT/modules_first_restores_16k_h100.log | tail -8

### call 2
# Session 17, call 2: saved_again (cos/sin prefetched in order) + the batch emulation patch (inert unless
# TORCH_OFFLOAD_EXP_BATCH is set): CUDA tests, then modules 4k step by step.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
(cd python_tests && timeout 150 python3 -m pytest -q -m cuda test_first_restores.py test_modules.py test_save_hooks_c.py test_activations_dedup.py > $OUT/gpu_pytest_cuda_h100_session17_call2.log 2>&1; tail -3 $OUT/gpu_pytest_cuda_h100_session17_call2.log)
timeout 200 python3 benchmarks/results/modules_first_restores_4k.py 4096 40 first,first@5,first@32,none > $OUT/modules_batch_emulation_4k_h100.log 2>&1; grep -v -i warn $OUT/modules_batch_emulation_4k_h100.log | tail -20
timeout 120 python3 benchmarks/results/modules_first_restores_4k.py 16384 8 first,nofirst,none > $OUT/modules_first_restores_16k_saved_again_h100.log 2>&1; grep -v -i warn $OUT/modules_first_restores_16k_saved_again_h100.log | tail -12

### call 3
# Session 17, call 3: batched copies in modules mode: C++ tests with CUDA, CUDA pytest cases of the
# touched files, then modules step by step (batch on / off / no hooks) at 4k and 16k.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
(export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$ROOT/build:$LD_LIBRARY_PATH
 TORCH_OFFLOAD_TEST_ROUNDS_PERCENT=50 timeout 200 .gpu/bin/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100_session17_batch.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest_h100_session17_batch.log)
(cd python_tests && timeout 150 python3 -m pytest -q -m cuda test_first_restores.py test_modules.py test_save_hooks_c.py test_activations_dedup.py test_activations.py > $OUT/gpu_pytest_cuda_h100_session17_call3.log 2>&1; tail -3 $OUT/gpu_pytest_cuda_h100_session17_call3.log)
timeout 150 python3 benchmarks/results/modules_first_restores_4k.py 4096 40 first,nobatch,none > $OUT/modules_batch_4k_h100.log 2>&1; grep -v -i warn $OUT/modules_batch_4k_h100.log | tail -12
timeout 120 python3 benchmarks/results/modules_first_restores_4k.py 16384 8 first,nobatch,none > $OUT/modules_batch_16k_h100.log 2>&1; grep -v -i warn $OUT/modules_batch_16k_h100.log | tail -12

### call 4
# Session 17, call 4: modules `*.self_attn`, one model copy per variant, step by step: the in-flight
# bound (4, 8, 16) with batched copies, and 4 without batching; against plain training; with peaks.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/stepwise_models_issue10.py 4096 40 plain,modules,modules_nobatch,modules_mif8,modules_mif16 > $OUT/stepwise_models_modules_4k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_models_modules_4k_h100.log | tail -7
timeout 250 python3 benchmarks/results/stepwise_models_issue10.py 16384 8 plain,modules,modules_mif8,modules_mif16 > $OUT/stepwise_models_modules_16k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_models_modules_16k_h100.log | tail -6

### call 5
# Session 17, call 5: where the 4k modules step's extra time goes on the GPU: one profiled step of
# plain training and of modules (kernel busy per stream, copies), then the forward's host time
# against its GPU span (6 rounds).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/profile_short_step.py --out /tmp/prof --seq 4096 --variants none,modules > $OUT/profile_4k_modules_batch_h100.log 2>&1; grep -E "^===|kernel busy|copies ms|runtime top|x ckpt" $OUT/profile_4k_modules_batch_h100.log
timeout 200 python3 benchmarks/results/modules_forward_bound_4k.py 4096 6 > $OUT/modules_forward_bound_4k_batch_h100.log 2>&1; grep -v -i warn $OUT/modules_forward_bound_4k_batch_h100.log | tail -7

### call 6
# Session 17, call 6: py-spy (native) over the 4k loop, plain training and modules with batched copies.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
pip install -q --no-deps .whl/py_spy-0.4.3-py2.py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl 2>&1 | tail -1
for mode in none modules; do
  python3 benchmarks/results/modules_loop_4k.py 350 $mode > $OUT/modules_loop_4k_${mode}_batch_h100.log 2>&1 &
  pid=$!
  sleep 22
  py-spy record --native --format raw --rate 200 -d 12 --pid $pid -o $OUT/modules_4k_${mode}_batch_pyspy_h100.txt > /dev/null 2>&1
  wait $pid; tail -1 $OUT/modules_loop_4k_${mode}_batch_h100.log
  gzip $OUT/modules_4k_${mode}_batch_pyspy_h100.txt
done
ls -la $OUT

### call 7
# Session 17, call 7 (carry .whl/trl-1.16.0-py3-none-any.whl): the final build in the benchmarks' own
# rounds: modules at 4k and 16k, `all` at 16k beside TRL 1.16, bf16 gradients at 4k.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | grep -v -i warn | tail -1
timeout 330 python3 benchmarks/bench_modules.py --out $OUT/mod --seqs 4096,16384 --steps 5 --rounds 7 > $OUT/bench_modules.log 2>&1; tail -12 $OUT/bench_modules.log
timeout 120 python3 benchmarks/bench_activations.py --out $OUT/act --seqs 16384 --variants none,all,trl --no-noise \
  --soak-steps 2 --warmup 1 --steps 3 > $OUT/bench_activations.log 2>&1; tail -8 $OUT/bench_activations.log
timeout 100 python3 benchmarks/bench_activations.py --out $OUT/noise --seqs 4096 --variants none,all,modules --steps 3 \
  --warmup 1 --soak-steps 2 > $OUT/bench_noise.log 2>&1; tail -8 $OUT/bench_noise.log

### call 8
# Session 17, call 8: does copy traffic alone slow the host-bound 4k step? Plain training with the
# modules mode's bytes copied on a side stream; and modules step by step with and without its copies.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/results/dma_interference_4k.py 4096 40 1612 start > $OUT/dma_interference_start_4k_h100.log 2>&1; grep -v -i warn $OUT/dma_interference_start_4k_h100.log | tail -9
timeout 150 python3 benchmarks/results/modules_first_restores_4k.py 4096 40 first,nocopy,none > $OUT/modules_nocopy_4k_h100.log 2>&1; grep -v -i warn $OUT/modules_nocopy_4k_h100.log | tail -10

### call 9
# Session 17, call 9: copy traffic during the forward (queued when the first layer starts).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/results/dma_interference_4k.py 4096 40 1612 > $OUT/dma_interference_layer0_4k_h100.log 2>&1; grep -v -i warn $OUT/dma_interference_layer0_4k_h100.log | tail -9

### call 10
# Session 17, call 10: every CUDA pytest case with the final build (each save-hook test with both hook sets).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
(cd python_tests && timeout 540 python3 -m pytest -q -p no:cacheprovider -m cuda . > $OUT/gpu_pytest_cuda_h100_session17_all.log 2>&1; echo "pytest rc=$?"; tail -4 $OUT/gpu_pytest_cuda_h100_session17_all.log)

### call 11
# Session 17, call 11: what modules mode's module hooks cost by themselves at 4k (one model copy per variant).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/stepwise_models_issue10.py 4096 40 plain,modules_nosave,modules > $OUT/stepwise_models_modules_nosave_4k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_models_modules_nosave_4k_h100.log | tail -5

### call 12
# Session 17, call 12: modules against plain training step by step, two model copies only, more sets.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/stepwise_models_issue10.py 4096 80 plain,modules > $OUT/stepwise_models_modules_pair_4k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_models_modules_pair_4k_h100.log | tail -3
timeout 200 python3 benchmarks/results/stepwise_models_issue10.py 16384 10 plain,modules > $OUT/stepwise_models_modules_pair_16k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_models_modules_pair_16k_h100.log | tail -3

### call 13
# Session 17, call 13: issue 10's comparisons step by step with this session's engine (no change in their paths).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 250 python3 benchmarks/results/stepwise_models_issue10.py 16384 12 ckpt,hidden,selective > $OUT/stepwise_models_16k_session17_h100.log 2>&1; grep -v -i warn $OUT/stepwise_models_16k_session17_h100.log | tail -4

### call 14 (before the gpu_check.sh limits were raised; summary in gpu_check_session17_before_h100.txt)
SKIP_BENCH=1 bash benchmarks/gpu_check.sh $OUT

### call 15 (ctest in parallel, pytest's CUDA cases: test_manager_lifetime's subprocess could not import the package)
SKIP_BENCH=1 bash benchmarks/gpu_check.sh $OUT

### call 16 (after the test's fix; gpu_check_session17_h100.txt)
SKIP_BENCH=1 SKIP_DEMO=1 bash benchmarks/gpu_check.sh $OUT
