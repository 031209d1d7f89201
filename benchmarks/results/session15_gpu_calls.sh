# Session 15 (2026-11-24): the GPU calls, in order; each ran as `bash .gpu/s15callN.sh` on nvidia-h100-x1
# with carry [build/libtorch_offload.so, .gpu]. Call 5's .gpu/old was `git archive 866095f torch_offload`; calls 6-7 carried
# .gpu/poll/libtorch_offload.so, built with session15_fence_poll_experiment.patch (in call 6 its first form, which polled
# always, without the variable); call 8's library and .gpu/bin/torch_offload_tests
# were built with session15_copy_launcher.patch (neither patch kept).

### call 1
# Session 15, call 1: issue 10, selective "attention" at 4k: forward / backward split per variant,
# then one profiled step of checkpointing, hidden_states and selective with per-thread host time.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/results/selective_phases_4k.py 4096 3 2>&1 | grep -v -i warn | tee $OUT/selective_phases_4k_h100.log
timeout 150 python3 benchmarks/profile_short_step.py --out /tmp/prof --seq 4096 --variants ckpt,hidden_states,selective,selective_re > $OUT/profile_4k_selective_h100.log 2>&1
python3 benchmarks/results/trace_threads.py /tmp/prof/trace_*.json 2>&1 | tee $OUT/profile_4k_selective_threads_h100.log
tail -30 $OUT/profile_4k_selective_h100.log

### call 2
# Session 15, call 2: issue 10, host time of one attention call as selective intercepts it (4k shape).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 120 python3 benchmarks/results/sdpa_interception_cost.py 4096 2>&1 | grep -v -i warn | tee $OUT/sdpa_interception_cost_h100.log

### call 3
# Session 15, call 3: issue 10 after the lean interception (selective at 4k), 16k unchanged?, and the
# CUDA cases of the selective tests.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 60 python3 benchmarks/results/sdpa_interception_cost.py 4096 2>&1 | grep -v -i warn | tee $OUT/sdpa_interception_cost_lean_h100.log
timeout 200 python3 benchmarks/results/selective_phases_4k.py 4096 3 2>&1 | grep -v -i warn | tee $OUT/selective_phases_4k_lean_h100.log
timeout 200 python3 benchmarks/bench_selective.py --out $OUT/sel4k --seqs 4096 --rounds 7 --steps 5 --warmup 1 --variants ckpt,ckpt_re,hidden,hidden_re,selective,selective_re > $OUT/sel4k.log 2>&1; tail -12 $OUT/sel4k/*.md
timeout 150 python3 benchmarks/bench_selective.py --out $OUT/sel16k --seqs 16384 --rounds 2 --steps 3 --warmup 1 --variants ckpt,selective,sel:attention+qkv+out_proj > $OUT/sel16k.log 2>&1; tail -8 $OUT/sel16k/*.md
(cd python_tests && timeout 120 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_selective.py test_selective_keep.py test_auto.py 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session15_call3.log | tail -3)

### call 4
# Session 15, call 4: issue 10, selective's forward host time at 4k under the profiler.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/profile_forward_4k.py 4096 hidden_states,selective,hidden_states_re,selective_re 2>&1 | grep -v -i warn > $OUT/profile_forward_4k_h100.log
grep -E "^===|cudnn|Python|offload|detach|cudaEvent|cudaStream|cudaMemcpy|cudaHost|Self CPU time|empty_strided|aten::empty " $OUT/profile_forward_4k_h100.log | cut -c1-62,63-150

### call 5
# Session 15, call 5: issue 10, A/B of the lean interception (Python only; same library): the
# package of 866095f (before, run from .gpu/old) and of this tree (after) in alternating processes.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONUNBUFFERED=1
ROOT=$PWD
for i in 1 2 3; do
  for which in before after; do
    if [ $which = before ]; then DIR=$ROOT/.gpu/old; else DIR=$ROOT; fi
    echo "== process $i, $which"
    (cd $DIR && PYTHONPATH=$DIR timeout 100 python3 $ROOT/benchmarks/results/selective_phases_4k.py 4096 2 ckpt,hidden_states,selective,ckpt_re,selective_re 2>&1 | grep -v -i warn | tail -5)
  done
done 2>&1 | tee $OUT/selective_lean_ab_4k_h100.log

### call 6
# Session 15, call 6: A/B of the releaser's waits: spinning in cudaEventSynchronize (this tree's
# library) against polling the event every 50 us (.gpu/poll, an experiment) in alternating
# processes at 4k: does the spinning thread slow the threads that launch the step's work?
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
for i in 1 2 3; do
  for which in spin poll; do
    if [ $which = spin ]; then LIB=$ROOT/build/libtorch_offload.so; else LIB=$ROOT/.gpu/poll/libtorch_offload.so; fi
    echo "== process $i, $which"
    TORCH_OFFLOAD_LIBRARY=$LIB timeout 100 python3 benchmarks/results/selective_phases_4k.py 4096 2 ckpt,hidden_states,selective,hidden_states_re 2>&1 | grep -v -i warn | tail -4
  done
done 2>&1 | tee $OUT/releaser_poll_ab_4k_h100.log

### call 7
# Session 15, call 7: the releaser spinning vs polling (experiment library .gpu/poll), in one process,
# interleaved rounds, 4k and 16k.
export TORCH_OFFLOAD_LIBRARY=$PWD/.gpu/poll/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/results/fence_poll_ab_4k.py 4096 6 hidden_states,selective,modules 2>&1 | grep -v -i warn | tee $OUT/fence_poll_ab_4k_h100.log
timeout 200 python3 benchmarks/results/fence_poll_ab_4k.py 16384 2 hidden_states,modules 2>&1 | grep -v -i warn | tee $OUT/fence_poll_ab_16k_h100.log

### call 8
# Session 15, call 8: issue 13, copies issued by a launcher thread (TORCH_OFFLOAD_COPY_THREAD=1):
# the C++ CUDA tests (each transfer and concurrency test both ways), the save-hook CUDA cases with
# the launcher on, then the in-process A/B at 4k and 16k.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
(export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$ROOT/build:$LD_LIBRARY_PATH
 TORCH_OFFLOAD_TEST_ROUNDS_PERCENT=50 timeout 230 .gpu/bin/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100_session15_launcher.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest_h100_session15_launcher.log)
(cd python_tests && TORCH_OFFLOAD_COPY_THREAD=1 timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_activations.py test_activations_dedup.py test_modules.py test_save_filter.py test_selective.py test_checkpoint.py test_keep_on_device.py 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session15_launcher.log | tail -3)
timeout 280 python3 benchmarks/results/copy_thread_ab.py 4096 6 modules,hidden_states,selective 2>&1 | grep -v -i warn | tee $OUT/copy_thread_ab_4k_h100.log
timeout 120 python3 benchmarks/results/copy_thread_ab.py 16384 2 modules 2>&1 | grep -v -i warn | tee $OUT/copy_thread_ab_16k_h100.log

### call 9
# Session 15, call 9: issue 10, hidden_states' 1% at 16k: does the caching allocator go to the driver
# during its steps (device allocations, frees, retries) where checkpointing does not?
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 240 python3 benchmarks/results/allocator_events_16k.py 16384 2 2>&1 | grep -v -i warn | tee $OUT/allocator_events_16k_h100.log

### call 10
# Session 15, call 10: issue 10, hidden_states at 16k with the in-flight bound at 4 (default), 16 and
# unbounded, beside checkpointing, 4 interleaved rounds in one process.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 400 python3 benchmarks/results/allocator_events_16k.py 16384 4 ckpt,hidden_states,hidden_mif16,hidden_mif0 2>&1 | grep -v -i warn | tee $OUT/inflight_bound_16k_h100.log

### call 11
# Session 15, call 11: issue 10, hidden_states at 16k against itself without copies
# (keep_on_device_bytes=1e12) and checkpointing, 6 interleaved rounds in one process.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 500 python3 benchmarks/results/allocator_events_16k.py 16384 6 ckpt,hidden_states,hidden_nocopy 2>&1 | grep -v -i warn | tee $OUT/hidden_nocopy_16k_rounds_h100.log

### call 12
# Session 15, call 12: issue 10, hidden_states at 32k against itself without copies and checkpointing
# (3 rounds), and where hidden_states' peak sits at 16k (eager, memory snapshot).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 330 python3 benchmarks/results/allocator_events_16k.py 32768 3 ckpt,hidden_states,hidden_nocopy 2>&1 | grep -v -i warn | tee $OUT/hidden_nocopy_32k_rounds_h100.log
timeout 200 python3 benchmarks/peak_memory.py --out $OUT/peak --layers 24 --seqs 16384 --variants ckpt_eager,ours_eager > $OUT/peak_memory_eager_16k_h100.log 2>&1; tail -30 $OUT/peak_memory_eager_16k_h100.log
ls $OUT/peak

### call 13
# Session 15, call 13: issue 10, hidden_states at 16k with the block input's device copy released by
# the releaser thread (no compute-stream wait per block) against in stream order, 4 rounds.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 400 python3 benchmarks/results/allocator_events_16k.py 16384 4 ckpt,hidden_states,hidden_nofinish,hidden_nocopy 2>&1 | grep -v -i warn | tee $OUT/hidden_nofinish_16k_h100.log

### call 14
# Session 15, call 14: issue 10, backward's first restores prefetched during the LM head's backward
# (first_restores.py, Manager::prefetch_newest): C++ tests with CUDA, the CUDA cases of the touched
# files, then in one process with and without the hook at 16k (4 rounds) and 32k (2 rounds).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
(export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$ROOT/build:$LD_LIBRARY_PATH
 TORCH_OFFLOAD_TEST_ROUNDS_PERCENT=50 timeout 160 .gpu/bin/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100_session15_first_restores.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest_h100_session15_first_restores.log)
(cd python_tests && timeout 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_first_restores.py test_selective.py test_checkpoint.py test_auto.py 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session15_first_restores.log | tail -3)
timeout 200 python3 benchmarks/results/allocator_events_16k.py 16384 4 ckpt,hidden_states,hidden_states_nohook,selective,selective_nohook 2>&1 | grep -v -i warn > $OUT/first_restores_16k_h100.log
timeout 150 python3 benchmarks/results/allocator_events_16k.py 32768 2 ckpt,hidden_states,hidden_states_nohook 2>&1 | grep -v -i warn > $OUT/first_restores_32k_h100.log
for f in $OUT/first_restores_16k_h100.log $OUT/first_restores_32k_h100.log; do grep -E "step|compute wait|peak" $f | cut -c1-120; done

### call 15
# Session 15, call 15: issue 10 with backward's first restores prefetched: the benchmark's own rounds
# at 16k (checkpointing, hidden_states, "attention", "attention+qkv+out_proj") and 32k, and the fixed
# CUDA case of test_selective.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
(cd python_tests && timeout 60 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_selective.py test_first_restores.py 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session15_call15.log | tail -2)
timeout 200 python3 benchmarks/bench_selective.py --out $OUT/sel16k --seqs 16384 --rounds 4 --steps 3 --warmup 1 --variants ckpt,hidden,selective,sel:attention+qkv+out_proj > $OUT/sel16k.log 2>&1; tail -9 $OUT/sel16k/*.md
timeout 200 python3 benchmarks/bench_selective.py --out $OUT/sel32k --seqs 32768 --rounds 2 --steps 3 --warmup 1 --variants ckpt,hidden,selective > $OUT/sel32k.log 2>&1; tail -8 $OUT/sel32k/*.md

### call 16
# Session 15, call 16: issue 10, the final code's hidden_states and "attention" against checkpointing
# in 6 rounds at 16k and 4 at 32k (bench_selective's own rounds).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/bench_selective.py --out $OUT/sel16k --seqs 16384 --rounds 6 --steps 3 --warmup 1 --variants ckpt,hidden,selective > $OUT/sel16k.log 2>&1; tail -8 $OUT/sel16k/*.md
timeout 300 python3 benchmarks/bench_selective.py --out $OUT/sel32k --seqs 32768 --rounds 4 --steps 3 --warmup 1 --variants ckpt,hidden,selective > $OUT/sel32k.log 2>&1; tail -8 $OUT/sel32k/*.md
