# Session 19 (2026-11-24): the GPU calls, in order; calls 2-5, 7, 8, 10 and 11 ran as `bash .gpu/s19callN.sh $OUT` on nvidia-h100-x1, call 9 on
# nvidia-h200-x2 (lent late in the session), with carry
# [build/libtorch_offload.so, build/_save_hooks.cpython-312-x86_64-linux-gnu.so (built here against /root/.pyenv/versions/3.12.1 as
# session18_gpu_calls.sh's header says), .gpu]; calls 1 and 6 built everything on the GPU machine itself. Calls 1-4 ran 4437ed3's code, calls 5-9 that plus the C SavedView holding its handle in C++
# (ead7be6; call 8 also carried build/old, the library with ead7be6~1's save hooks, built here the same way; calls 7 and 9 ran f356603)
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

### call 7
# Session 19, call 7 (carry .whl/trl-1.16.0-py3-none-any.whl): issue 13's figures on the final code (6175751):
# hidden_states through the disk tier at 32k / 64k against checkpointing, `all` at 16k beside TRL 1.16's
# OffloadActivations, modules `*.self_attn` at 4k / 16k in bench_modules' rounds.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | grep -v -i warn | tail -1
timeout 200 python3 -m torch_offload.bench --modes checkpointing,hidden_states_disk --seqs 32768,65536 --steps 4 --warmup 1 \
  --disk-dir /tmp --json $OUT/bench_cli_disk_session19_h100.json > $OUT/bench_cli_disk_session19_h100.log 2>&1
grep -v -i warn $OUT/bench_cli_disk_session19_h100.log | tail -8
timeout 110 python3 benchmarks/bench_activations.py --out $OUT/act --seqs 16384 --variants all,trl --no-noise \
  --soak-steps 2 --warmup 1 --steps 3 > $OUT/bench_activations_session19.log 2>&1; tail -6 $OUT/bench_activations_session19.log
timeout 200 python3 benchmarks/bench_modules.py --out $OUT/mod --seqs 4096,16384 --steps 5 --rounds 5 > $OUT/bench_modules_session19.log 2>&1
tail -8 $OUT/bench_modules_session19.log

### call 8
# Session 19, call 8 (carry build/old: the library with the save hooks of ead7be6~1, SavedView holding Python objects):
# did the C SavedView change the 4k modules step in bench_modules' rounds (call 7 read 1.287x)? Alternating
# processes, new / old / new / old, each 3 rounds at 4k.
OUT=${1:?}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for i in 1 2; do
  for which in new old; do
    lib=$PWD/build/libtorch_offload.so; [ $which = old ] && lib=$PWD/build/old/libtorch_offload.so
    TORCH_OFFLOAD_LIBRARY=$lib timeout 110 python3 benchmarks/bench_modules.py --out $OUT/mod_${which}_$i --seqs 4096 --steps 5 --rounds 3 \
      > $OUT/bench_modules_4k_${which}_${i}_session19.log 2>&1
    echo "$which $i: $(grep '| 4096 | modules' $OUT/mod_${which}_$i/modules_h100.md)"
  done
done

### call 9
# Session 19, call 9 (nvidia-h200-x2): the C save hooks, modules' batched copies and the C checkpoint frames under
# FSDP2 on 2 GPUs (first time since sessions 16-18 added them): gradients of every variant against FSDP2 +
# checkpointing, then memory and speed per rank at 16k.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 torchrun --standalone --nproc_per_node=2 benchmarks/fsdp2_gradients.py --out $OUT > $OUT/fsdp2_gradients_session19.log 2>&1
echo "gradients rc=$?"; grep -v -i warn $OUT/fsdp2_gradients_session19.log | tail -16
timeout 200 torchrun --standalone --nproc_per_node=2 benchmarks/bench_fsdp2.py --seqs 16384 --variants ckpt,hs_before,hs_after,all \
  --warmup 1 --steps 2 --timeout-s 150 --deadline-s 170 --out $OUT > $OUT/bench_fsdp2_16k_session19.log 2>&1
echo "bench rc=$?"; grep -v -i warn $OUT/bench_fsdp2_16k_session19.log | tail -10

### call 10
# Session 19, call 10: the open question of session 7 (auto's window traded for a second unchecked block ran 25-40 ms
# slower in all three runs): the two fixed plans side by side in interleaved rounds, Llama-3-8B shape at 8k.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python3 benchmarks/bench_selective.py --out $OUT/tail8b --shape llama3_8b --seqs 8192 --rounds 3 --steps 3 --warmup 1 \
  --variants ckpt,sel:attention+qkv+out_proj@0.61#1,sel:attention+qkv+out_proj@0.40#2 > $OUT/bench_selective_tail_8b_session19_h100.log 2>&1
grep -v -i warn $OUT/bench_selective_tail_8b_session19_h100.log | cut -c1-300 | tail -8

### call 11
# Session 19, call 11: is hidden_states' last fraction of a percent at 16k / 32k the copies? hidden_states beside
# the same mode with every block input kept on the GPU (no copy: checkpointing's GPU work through our checkpoint),
# step by step against torch's checkpointing.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/results/stepwise_models_issue10.py 32768 10 ckpt,hidden,hidden_nocopy \
  > $OUT/stepwise_nocopy_32k_session19_h100.log 2>&1; grep -v -i warn $OUT/stepwise_nocopy_32k_session19_h100.log | tail -7
timeout 150 python3 benchmarks/results/stepwise_models_issue10.py 16384 20 ckpt,hidden,hidden_nocopy \
  > $OUT/stepwise_nocopy_16k_session19_h100.log 2>&1; grep -v -i warn $OUT/stepwise_nocopy_16k_session19_h100.log | tail -7
