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
