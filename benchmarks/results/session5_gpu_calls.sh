# Session 5 (2026-11-23): the device calls, in order. Each ran in the repository root on the device machine
# with build/libtorch_offload.so (built on the development machine) and .gpu/ carried; $OUT is the device's output folder.

# --- s5call1.sh (nvidia-h100-x1)
# Session 5, call 1 (H100): host cost per offload op; the reentrant variant and projection groups
# beside torch's two checkpoints at 4k (3 interleaved rounds), 16k, 64k and on the Llama-3-8B shape at 8k.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 benchmarks/op_host_cost.py --json $OUT/op_host_cost_h100.json 2>&1 | tail -3
timeout 150 python3 benchmarks/bench_selective.py --out /tmp/s4k --seqs 4096 --rounds 3 --steps 5 --warmup 1 --variants ckpt,ckpt_re,hidden,hidden_re,selective,selective_re,sel_re:attention+fc2 2>&1 | grep -E "^\| 4096|vs ckpt" | head -12
cp /tmp/s4k/selective_h100.md $OUT/selective_4k_h100.md; cp /tmp/s4k/selective_h100.json $OUT/selective_4k_h100.json
timeout 150 python3 benchmarks/bench_selective.py --out /tmp/s16k --seqs 16384 --steps 3 --warmup 1 --variants ckpt,ckpt_re,hidden,hidden_re,selective,selective_re,selective_qkv,sel:attention+out_proj,sel:attention+qkv+out_proj,sel_re:attention+fc2,sel_re:attention+out_proj+fc2,sel_re:attention+qkv+out_proj+fc2 2>&1 | grep -E "^\| 16384" | head -14
cp /tmp/s16k/selective_h100.md $OUT/selective_16k_h100.md; cp /tmp/s16k/selective_h100.json $OUT/selective_16k_h100.json
timeout 170 python3 benchmarks/bench_selective.py --out /tmp/s64k --seqs 65536 --steps 2 --warmup 1 --variants ckpt,selective,selective_re,sel:attention+qkv+out_proj,sel_re:attention+qkv+out_proj+fc2,sel:attention+qkv+out_proj+fc1 2>&1 | grep -E "^\| 65536" | head -8
cp /tmp/s64k/selective_h100.md $OUT/selective_64k_h100.md; cp /tmp/s64k/selective_h100.json $OUT/selective_64k_h100.json

# --- s5call2.sh (nvidia-h100-x1)
# Session 5, call 2 (H100): ablations of hidden_states at 4k; Llama-3-8B shape at 8k; fc1 offload at 64k.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 150 python3 .gpu/ablate_hs4k.py 4096 ckpt,ckpt_re,hidden,hidden_re,hidden_no_prefetch,hidden_no_copy 2>&1 | tail -2 | tee $OUT/ablate_hs4k.log
timeout 260 python3 benchmarks/bench_selective.py --out /tmp/s8b --shape llama3_8b --seqs 8192 --steps 3 --warmup 1 --variants ckpt,ckpt_re,hidden,selective,sel:attention+qkv+out_proj,selective_re,sel_re:attention+qkv+out_proj+fc2 2>&1 | grep -E "^\| 8192" | head -9
cp /tmp/s8b/selective_h100_llama3_8b.md $OUT/; cp /tmp/s8b/selective_h100_llama3_8b.json $OUT/
timeout 150 python3 benchmarks/bench_selective.py --out /tmp/s64 --seqs 65536 --steps 2 --warmup 1 --variants ckpt,sel:attention+qkv+out_proj+fc1 2>&1 | grep -E "^\| 65536" | head -4
cp /tmp/s64/selective_h100.md $OUT/selective_64k_fc1_h100.md; cp /tmp/s64/selective_h100.json $OUT/selective_64k_fc1_h100.json

# --- s5call3.sh (nvidia-h100-x1)
# Session 5, call 3 (H100): after blocking-sync copy fences (no spinning waiter threads): 4k ablations,
# 4k selective (5 interleaved rounds), modules at 4k/16k.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 150 python3 .gpu/ablate_hs4k.py 4096 ckpt,ckpt_re,hidden,hidden_re,hidden_no_copy 2>&1 | tail -2 | tee $OUT/ablate_hs4k_blocking_sync.log
timeout 200 python3 benchmarks/bench_selective.py --out /tmp/s4k --seqs 4096 --rounds 5 --steps 5 --warmup 1 --variants ckpt,ckpt_re,hidden,hidden_re,selective,selective_re 2>&1 | grep -E "^\| 4096" | head -8
cp /tmp/s4k/selective_h100.md $OUT/selective_4k_blocking_sync_h100.md; cp /tmp/s4k/selective_h100.json $OUT/selective_4k_blocking_sync_h100.json
timeout 200 python3 benchmarks/bench_modules.py --out /tmp/mod --seqs 4096,16384 --steps 5 2>&1 | grep -E "^\| (4096|16384)" | head -8
cp /tmp/mod/modules_h100.md $OUT/modules_blocking_sync_h100.md; cp /tmp/mod/modules_h100.json $OUT/modules_blocking_sync_h100.json

# --- call 2b (nvidia-h100-x1): the ablation again after fixing the script (its first run in call 2 failed on a module name)
timeout 200 python3 .gpu/ablate_hs4k.py 4096 ckpt,ckpt_re,hidden,hidden_re,hidden_no_prefetch,hidden_no_copy 2>&1 | tail -3 | tee $OUT/ablate_hs4k.log
# (.gpu/ablate_hs4k.py is committed as benchmarks/results/ablate_hidden_states_4k.py)

# --- s5call4.sh (nvidia-h100-x1)
# Session 5, call 4 (H100): C++ tests with CUDA and every CUDA pytest case after the blocking-sync fences
# and the reentrant variant; hidden_states at 16k/32k (no slowdown from sleeping waiters); auto and its
# reentrant variant at 4k and 16k; the 4k ablation with the garbage collector frozen.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$PWD/build
timeout 200 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest.log
(cd python_tests && timeout 330 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda . 2>&1 | tail -12) > $OUT/pytest_cuda_all.log; tail -4 $OUT/pytest_cuda_all.log

# --- s5call5.sh (nvidia-h100-x1)
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 200 python3 -m torch_offload.bench --modes checkpointing,hidden_states --seqs 16384,32768 --steps 4 --warmup 1 --json $OUT/bench_cli_h100_blocking_sync.json --no-progress 2>&1 | tail -6
timeout 250 python3 benchmarks/bench_selective.py --out /tmp/sa --seqs 4096,16384 --steps 5 --warmup 1 --variants ckpt,ckpt_re,auto,auto_re 2>&1 | grep -E "^\| (4096|16384)|auto \(" | head -12
cp /tmp/sa/selective_h100.md $OUT/selective_auto_reentrant_h100.md; cp /tmp/sa/selective_h100.json $OUT/selective_auto_reentrant_h100.json
TORCH_OFFLOAD_GC_FREEZE=1 timeout 120 python3 .gpu/ablate_hs4k.py 4096 ckpt,ckpt_re,hidden,hidden_re 2>&1 | tail -2 | tee $OUT/ablate_hs4k_gc_frozen.log


# --- s5call6.sh (nvidia-h100-x1)
# Session 5, call 6 (H100): bf16 gradients of the new variants against the noise floor (4k); the 16k
# selective policies in 3 interleaved rounds; mode="auto" on the Llama-3-8B shape at 8k with today's candidates.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 200 python3 benchmarks/bench_selective.py --out /tmp/n --seqs 16384 --rounds 3 --steps 3 --warmup 1 --noise-seq 4096 --variants ckpt,hidden,selective,sel:attention+qkv+out_proj,hidden_re,selective_re 2>&1 | grep -E "^\| 16384|^Gradients" | head -10
cp /tmp/n/selective_h100.md $OUT/selective_16k_rounds_noise_h100.md; cp /tmp/n/selective_h100.json $OUT/selective_16k_rounds_noise_h100.json
timeout 250 python3 benchmarks/bench_selective.py --out /tmp/a8 --shape llama3_8b --seqs 8192 --steps 3 --warmup 1 --variants ckpt,auto 2>&1 | grep -E "^\| 8192|auto \(" | head -5
cp /tmp/a8/selective_h100_llama3_8b.md $OUT/selective_auto_h100_llama3_8b.md; cp /tmp/a8/selective_h100_llama3_8b.json $OUT/selective_auto_h100_llama3_8b.json

# --- s5call7.sh (nvidia-h100-x1)
# Session 5, call 7 (H100): after pooled copy fences (cuda_transfer.cpp) and the leaner save path
# (saved_regions.py): C++ tests with CUDA, CUDA pytest cases, host time per op, modules at 4k/16k,
# `all` at 16k beside TRL.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$PWD/build
timeout 200 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest.log 2>&1; echo "gtest rc=$?"; tail -2 $OUT/gtest.log
(cd python_tests && timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_activations.py test_activations_dedup.py test_modules.py test_reentrant.py test_manager_lifetime.py test_selective.py 2>&1 | tail -4) > $OUT/pytest_cuda.log; tail -2 $OUT/pytest_cuda.log
timeout 60 python3 benchmarks/op_host_cost.py --json $OUT/op_host_cost_pooled_fences_h100.json 2>&1 | tail -2
timeout 150 python3 benchmarks/bench_modules.py --out /tmp/mod --seqs 4096,16384 --steps 5 2>&1 | grep -E "^\| (4096|16384)" | head -6
cp /tmp/mod/modules_h100.md $OUT/modules_pooled_fences_h100.md; cp /tmp/mod/modules_h100.json $OUT/modules_pooled_fences_h100.json
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
timeout 150 python3 benchmarks/bench_activations.py --out /tmp/act --seqs 16384 --variants all,trl --no-noise --soak-steps 3 --warmup 1 --steps 3 2>&1 | grep -E "^\| 16384" | head -4
cp /tmp/act/activations_h100.md $OUT/activations_pooled_fences_h100.md; cp /tmp/act/activations_h100.json $OUT/activations_pooled_fences_h100.json

# --- s5call8.sh (nvidia-h100-x1)
# Session 5, call 8 (H100): A/B of the copy-fence variants, each its own build of the library:
# orig (73b40e3: spinning events created per copy), blocking (46b190d: blocking-sync events created per
# copy), spinpool (pooled spinning events), current (pooled blocking-sync events).
export PYTHONPATH=$PWD
for v in orig blocking spinpool current; do
  lib=build-$v/libtorch_offload.so; [ $v = current ] && lib=build/libtorch_offload.so
  export TORCH_OFFLOAD_LIBRARY=$PWD/$lib
  echo "=== $v"
  timeout 60 python3 .gpu/event_cost.py 2>&1 | grep save
  timeout 100 python3 benchmarks/bench_modules.py --out /tmp/mod_$v --seqs 4096 --steps 5 2>&1 | grep -E "^\| 4096" | head -3
  timeout 100 python3 .gpu/ablate_hs4k.py 4096 ckpt_re,hidden_re,hidden 2>&1 | tail -2
done

# --- s5call9.sh (nvidia-h100-x1)
# Session 5, call 9 (H100): the final engine (pooled spinning copy fences): C++ tests with CUDA, CUDA pytest
# cases, host time per op, 4k ablation (5 rounds), modules 4k/16k, hidden_states 16k/32k.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$PWD/build
timeout 200 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest.log 2>&1; echo "gtest rc=$?"; tail -2 $OUT/gtest.log
(cd python_tests && timeout 330 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda . 2>&1 | tail -4) > $OUT/pytest_cuda_all.log; tail -2 $OUT/pytest_cuda_all.log
timeout 60 python3 benchmarks/op_host_cost.py --json $OUT/op_host_cost_final_h100.json 2>&1 | tail -2
timeout 120 python3 .gpu/ablate_hs4k.py 4096 ckpt,ckpt_re,hidden,hidden_re 2>&1 | tail -2 | tee $OUT/ablate_hs4k_final.log
timeout 120 python3 benchmarks/bench_modules.py --out /tmp/mod --seqs 4096,16384 --steps 5 2>&1 | grep -E "^\| (4096|16384)" | head -6
cp /tmp/mod/modules_h100.md $OUT/modules_final_h100.md; cp /tmp/mod/modules_h100.json $OUT/modules_final_h100.json
timeout 200 python3 -m torch_offload.bench --modes checkpointing,hidden_states --seqs 16384,32768 --steps 4 --warmup 1 --json $OUT/bench_cli_h100_final.json --no-progress 2>&1 | grep -E "^\| (16384|32768)"

# --- call 8b (nvidia-h100-x1): event and save costs per build (.gpu/event_cost.py, committed as benchmarks/results/event_cost.py) ran inside call 8's loop.
# --- call 10 (nvidia-h100-x1): op_host_cost of the original and the final build, alternating
for v in orig current orig current; do lib=build-$v/libtorch_offload.so; [ $v = current ] && lib=build/libtorch_offload.so; TORCH_OFFLOAD_LIBRARY=$PWD/$lib python3 benchmarks/op_host_cost.py --sizes-mb 1; done
# Builds: build-orig = csrc/cuda_transfer.cpp of 73b40e3, build-spinpool = the final code; each built with
# cmake --build build --target torch_offload and copied.

# --- s5call11.sh (nvidia-h100-x1)
# Session 5, call 11 (H100): the final engine at 4k, 7 interleaved rounds: torch's two checkpoints, hidden_states
# and selective "attention" in both variants, auto in both variants.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 400 python3 benchmarks/bench_selective.py --out /tmp/s4k --seqs 4096 --rounds 7 --steps 5 --warmup 1 --variants ckpt,ckpt_re,hidden,hidden_re,selective,selective_re 2>&1 | grep -E "^\| 4096" | head -8
cp /tmp/s4k/selective_h100.md $OUT/selective_4k_final_h100.md; cp /tmp/s4k/selective_h100.json $OUT/selective_4k_final_h100.json

# --- call 12 (nvidia-h100-x1): the manager's prefetch depth and in-flight bound for selective at 16k (.gpu/tune16k.py, committed as benchmarks/results/tune_selective_16k.py)
timeout 300 python3 .gpu/tune16k.py 2>&1 | tail -3 | tee $OUT/tune_selective_16k.log

# --- s5call13.sh (nvidia-h100-x1)
# Session 5, call 13 (H100): one profiled 4k step of torch's checkpoint, hidden_states and its reentrant
# variant (final build); per-thread host time from the Chrome traces.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 200 python3 benchmarks/profile_short_step.py --out /tmp/prof --seq 4096 --variants ckpt,hidden_states,hidden_states_re > $OUT/profile_4k_final.log 2>&1; grep "===\|runtime top" $OUT/profile_4k_final.log
python3 .gpu/trace_threads.py /tmp/prof/trace_ckpt.json /tmp/prof/trace_hidden_states.json /tmp/prof/trace_hidden_states_re.json 2>&1 | tee $OUT/profile_4k_threads.log

# --- s5call14.sh (nvidia-h100-x1); build-spinpool = the committed engine, build = the same with CudaFence::synchronize polling (query + 20 us sleeps), not kept
# Session 5, call 14 (H100): copy fences that poll (query + 20 us sleeps) instead of cudaEventSynchronize,
# against the pooled spinning build: C++ tests, per-thread host time of a profiled 4k step, 4k rounds.
export PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$PWD/build
timeout 100 build/tests/torch_offload_tests --gtest_brief=1 2>&1 | tail -2
for v in spinpool poll; do
  lib=build-$v/libtorch_offload.so; [ $v = poll ] && lib=build/libtorch_offload.so
  export TORCH_OFFLOAD_LIBRARY=$PWD/$lib
  echo "=== $v"
  timeout 100 python3 benchmarks/profile_short_step.py --out /tmp/prof_$v --seq 4096 --variants ckpt,hidden_states,hidden_states_re 2>&1 | grep "==="
  python3 .gpu/trace_threads.py /tmp/prof_$v/trace_ckpt.json /tmp/prof_$v/trace_hidden_states.json /tmp/prof_$v/trace_hidden_states_re.json 2>&1 | grep -E "==|tid" | cut -c1-110
  timeout 150 python3 benchmarks/bench_selective.py --out /tmp/s_$v --seqs 4096 --rounds 5 --steps 5 --warmup 1 --variants ckpt,ckpt_re,hidden,hidden_re 2>&1 | grep -E "^\| 4096"
done
