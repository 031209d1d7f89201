#!/usr/bin/env bash
# Session 22's GPU calls, as run (device tool, nvidia-h100-x1; carry build/libtorch_offload.so and
# build/_save_hooks.cpython-312-x86_64-linux-gnu.so built here where named, and .gpu/).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1

# Call 1: where the process sits (one NUMA node: a VM of 16 cores), the link per binding, and
# bench_modules at 4k in two processes on one machine -> numa_session22_h100.log
L=$OUT/numa_session22_h100.log
{ nproc; lscpu | grep -E "Model name|Socket|NUMA|Thread|Core"; nvidia-smi topo -m | head -8
  python3 benchmarks/results/d2h_bandwidth.py; } 2>&1 | tee $L
python3 benchmarks/results/numa_run.py 0 benchmarks/results/d2h_bandwidth.py 2>&1 | tee -a $L
for i in 1 2; do
  timeout 150 python3 benchmarks/bench_modules.py --out /tmp/b_p$i --seqs 4096 --steps 5 --rounds 5 2>&1 | grep -E "^\| 4096" | tee -a $L
done

# Call 2: does device-to-host traffic slow the host's code (twice), then the GPU check owed by
# session 21's review commit 03a4bd0 (code at 0ac67fc)
python3 benchmarks/results/dma_host_interference.py 15 2>&1 | tee $OUT/dma_host_interference_session22_h100.log
python3 benchmarks/results/dma_host_interference.py 15 2>&1 | tee -a $OUT/dma_host_interference_session22_h100.log
SKIP_BENCH=1 bash benchmarks/gpu_check.sh $OUT/check > $OUT/gpu_check_session22.log 2>&1

# Call 3: the caching allocator's driver calls per 4k step (default and expandable segments), and
# bench_modules 4k in both settings, twice -> allocator_churn_4k_session22_h100.log
python3 benchmarks/results/allocator_churn_4k.py 4096 20
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/results/allocator_churn_4k.py 4096 20
for conf in "" "expandable_segments:True" "" "expandable_segments:True"; do
  PYTORCH_CUDA_ALLOC_CONF=$conf python3 benchmarks/bench_modules.py --out /tmp/b --seqs 4096 --steps 5 --rounds 5
done

# Call 4: host time per phase of backward's restore path (session22_restore_path_phases.patch, since
# folded into session22_host_budget_phases.patch) -> restore_path_phases_4k_session22_h100.log
python3 benchmarks/results/modules_host_split_4k.py 4096 40 plain,modules

# Call 5: copies in flight bounded at 4 / 10 / 20; the garbage collector off, frozen, on
# -> modules_host_split_mif_4k_session22_h100.log, modules_host_split_gc_4k_session22_h100.log
python3 benchmarks/results/modules_host_split_4k.py 4096 40 plain,modules,modules_mif10,modules_mif20
HOST_SPLIT_GC=off python3 benchmarks/results/modules_host_split_4k.py 4096 40 plain,modules,modules_keep
HOST_SPLIT_GC=freeze python3 benchmarks/results/modules_host_split_4k.py 4096 40 plain,modules,modules_keep
python3 benchmarks/results/modules_host_split_4k.py 4096 40 plain,modules,modules_keep

# Call 6: host time per phase of the whole engine path (session22_host_budget_phases.patch applied,
# the C save hooks rebuilt with it) -> host_budget_phases_4k_session22_h100.log
python3 benchmarks/results/modules_host_split_4k.py 4096 40 plain,modules

# Calls 7-8: backward's grouped prefetch (commit 6f6a2cf, with session22_experiment_no_group.patch;
# it had the default-stream bug fixed in f80b188, so these A/Bs are void) and the ops' host time by
# scope under the CPU profiler -> modules_host_split_group{,2}_4k_session22_h100.log,
# modules_op_host_4k_session22_h100.log, gpu_pytest_cuda_h100_session22_call7.log
python3 benchmarks/results/modules_host_split_4k.py 4096 60 plain,modules,modules_nogroup
python3 benchmarks/results/modules_op_host_4k.py 4096 4
python3 benchmarks/results/modules_host_split_4k.py 4096 50 plain,modules,modules_nogroup

# Call 9: which thread's cudaEventSynchronize the profiler files under the forward
# -> modules_op_host_sync_4k_session22_h100.log
python3 benchmarks/results/modules_op_host_4k.py 4096 4

# Calls 10-11: the decoder layers' host time by submodule; then spinning against blocking-sync
# host waits (two processes each) -> modules_layer_split_4k_session22_h100.log,
# modules_layer_split_blocking_4k_session22_h100.log
python3 benchmarks/results/modules_layer_split_4k.py 4096 40
for i in 1 2; do
  python3 benchmarks/results/modules_layer_split_4k.py 4096 30
  LAYER_SPLIT_BLOCKING_SYNC=1 python3 benchmarks/results/modules_layer_split_4k.py 4096 30
done

# Call 12: GPU check of f80b188's parent (the grouped prefetch with the default-stream bug: ctest
# and one pytest case failed, which found it) and bench_modules (void: restores skipped their wait)
# -> gpu_check_final_session22.log, bench_modules_session22_h100.log, modules_session22_h100.json
SKIP_BENCH=1 bash benchmarks/gpu_check.sh $OUT/check
python3 benchmarks/bench_modules.py --out /tmp/bench --seqs 4096,16384 --steps 5 --rounds 5

# Call 13: the grouped prefetch after the fix, A/B in one process, twice; CUDA cases
# -> modules_host_split_group_fixed_4k_session22_h100.log, gpu_pytest_cuda_h100_session22_call13.log
for i in 1 2; do python3 benchmarks/results/modules_host_split_4k.py 4096 50 plain,modules,modules_nogroup; done
python3 -m pytest -q -m cuda python_tests/test_deferred_saves.py python_tests/test_modules.py python_tests/test_examples.py

# Call 14: backward's host time with and without the grouping, one process each, twice
# (un.total / mr.* / hd.total phases) -> restore_phases_group_4k_session22_h100.log
for v in modules modules_nogroup modules modules_nogroup; do
  python3 benchmarks/results/modules_host_split_4k.py 4096 20 plain,$v
done

# Call 15: bf16 gradients against plain training's noise floor (the final code, 0ac67fc's library)
# -> noise_4k_session22_h100.{log,json}
python3 benchmarks/bench_activations.py --out /tmp/noise --seqs 4096 --variants none,all,modules --steps 3 \
  --warmup 1 --soak-steps 2

# Calls 16-17: the 4k step without a sync after each step beside the synced step (two processes),
# then with 4 / 10 / 16 copies in flight -> modules_unsynced_4k_session22_h100.log,
# modules_unsynced_mif_4k_session22_h100.log
for i in 1 2; do python3 benchmarks/results/modules_unsynced_4k.py 4096 7 10; done
python3 benchmarks/results/modules_unsynced_4k.py 4096 8 10 10,16

# Call 18: the layer split with a variant whose forward thread has CPU 0 to itself (every other
# thread on the other CPUs) -> modules_layer_split_pinned_4k_session22_h100.log
LAYER_SPLIT_PIN=1 python3 benchmarks/results/modules_layer_split_4k.py 4096 40

# Call 19: bench_modules at 4k and 16k on the final library (0ac67fc's)
# -> bench_modules_final_session22_h100.log, modules_final_session22_h100.json
python3 benchmarks/bench_modules.py --out /tmp/bench --seqs 4096,16384 --steps 5 --rounds 5

# Call 20: every save kept and the host busy 150 us at each self_attn's end (about the engine's time
# there), beside modules mode -> modules_layer_split_spin_4k_session22_h100.log
LAYER_SPLIT_SPIN_US=150 python3 benchmarks/results/modules_layer_split_4k.py 4096 40
