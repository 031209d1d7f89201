# Session 19 (2026-11-24): the GPU calls, in order; calls 2-5 ran as `bash .gpu/s19callN.sh $OUT` on nvidia-h100-x1 with carry
# [build/libtorch_offload.so, build/_save_hooks.cpython-312-x86_64-linux-gnu.so (built here against /root/.pyenv/versions/3.12.1 as
# session18_gpu_calls.sh's header says), .gpu]; calls 1 and 6 built everything on the GPU machine itself. Calls 1-4 ran 4437ed3's code, call 5 that plus the C SavedView holding its handle in C++
# (call 4 also the percentiles and garbage-collector timing added to stepwise_models_issue10.py).

### call 1
SKIP_BENCH=1 bash benchmarks/gpu_check.sh $OUT > $OUT/gpu_check_session19.log 2>&1

### call 2
# Session 19, call 2: issue 10's edge targets on the final code (4437ed3): hidden_states at 32k / 16k and
# selective "attention" at 16k step by step; auto at 16k in rounds, with the model's loss and with the
# loss's gradients in forward, both under checkpointing's peak with the model's loss.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 benchmarks/results/stepwise_models_issue10.py 32768 12 ckpt,hidden \
  > $OUT/stepwise_32k_session19_h100.log 2>&1; grep -v -i warn $OUT/stepwise_32k_session19_h100.log | tail -3
timeout 150 python3 benchmarks/results/stepwise_models_issue10.py 16384 24 ckpt,hidden,selective \
  > $OUT/stepwise_16k_session19_h100.log 2>&1; grep -v -i warn $OUT/stepwise_16k_session19_h100.log | tail -4
timeout 260 python3 benchmarks/bench_selective.py --out $OUT/auto16 --seqs 16384 --rounds 4 --steps 4 --warmup 1 \
  --variants ckpt,auto,auto/grads_in_forward --auto-budget-gb ckpt > $OUT/bench_selective_auto_16k_session19_h100.log 2>&1
tail -8 $OUT/bench_selective_auto_16k_session19_h100.log

### call 3
# Session 19, call 3: issue 10's Llama-3-8B target at 8k on the final code (auto with the model's loss and with the
# loss's gradients in forward, budget = checkpointing's peak with the model's loss), 2 rounds; issue 13's modules
# `*.self_attn` at 4k against plain training step by step (2 model copies, 80 sets).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 benchmarks/results/stepwise_models_issue10.py 4096 80 plain,modules \
  > $OUT/stepwise_modules_4k_session19_h100.log 2>&1; grep -v -i warn $OUT/stepwise_modules_4k_session19_h100.log | tail -3
timeout 400 python3 benchmarks/bench_selective.py --out $OUT/auto8b --shape llama3_8b --seqs 8192 --rounds 2 --steps 3 --warmup 1 \
  --variants ckpt,auto,auto/grads_in_forward --auto-budget-gb ckpt > $OUT/bench_selective_auto_8b_session19_h100.log 2>&1
grep -v -i warn $OUT/bench_selective_auto_8b_session19_h100.log | cut -c1-300 | tail -6

### call 4
# Session 19, call 4: issue 13, modules `*.self_attn` at 4k step by step: where the slow steps (mean 1.124x against
# a median of 1.080x in call 3) come from: each variant's percentiles and the garbage collector's time per step,
# as is and with gc.freeze() after the set-up.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 benchmarks/results/stepwise_models_issue10.py 4096 80 plain,modules \
  > $OUT/stepwise_modules_4k_gc_session19_h100.log 2>&1; grep -v -i warn $OUT/stepwise_modules_4k_gc_session19_h100.log | tail -5
STEPWISE_GC_FREEZE=1 timeout 120 python3 benchmarks/results/stepwise_models_issue10.py 4096 80 plain,modules \
  > $OUT/stepwise_modules_4k_gc_freeze_session19_h100.log 2>&1; grep -v -i warn $OUT/stepwise_modules_4k_gc_freeze_session19_h100.log | tail -5

### call 5
# Session 19, call 5: the C SavedView holding its save handle and device as C++ values (no Python tensor per
# offloaded save): the CUDA cases of the save-hook test files, then modules `*.self_attn` at 4k against plain
# training step by step with the garbage collector's time per step (call 4: 0.29-0.31 ms in every modules step).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python_tests && timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider test_save_hooks_c.py test_activations.py \
  test_activations_dedup.py test_modules.py test_module_presets.py test_keep_on_device.py test_first_restores.py test_layers.py) \
  > $OUT/gpu_pytest_cuda_h100_session19_call5.log 2>&1; tail -2 $OUT/gpu_pytest_cuda_h100_session19_call5.log
for run in 1 2; do
  timeout 120 python3 benchmarks/results/stepwise_models_issue10.py 4096 80 plain,modules \
    > $OUT/stepwise_modules_4k_c_view_${run}_session19_h100.log 2>&1; grep -v -i warn $OUT/stepwise_modules_4k_c_view_${run}_session19_h100.log | tail -4
done

### call 6
SKIP_BENCH=1 bash benchmarks/gpu_check.sh $OUT > $OUT/gpu_check_session19_final.log 2>&1   # on ead7be6, built there
