#!/usr/bin/env bash
# Session 23's GPU calls, as run (each from the repository root on the GPU machine, with
# build/libtorch_offload.so and build/_save_hooks.cpython-312-x86_64-linux-gnu.so built locally and
# carried; OUT is the call's output folder). Results and what they show: README.md, "Session 23".
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1

# Call 1 (H100; library with session23_fence_cache_untimed_waits.patch): driver-call costs; the fence
# cache and untimed compute waits A/B in one process, twice; bench_modules
# -> driver_call_cost_session23_h100.log, modules_host_split_fence_4k_session23_h100.log,
#    bench_modules_session23_call1_h100.log, modules_session23_call1_h100.json
python3 benchmarks/results/driver_call_cost.py 4000
for i in 1 2; do
  python3 benchmarks/results/modules_host_split_4k.py 4096 40 plain,modules,modules_nocache,modules_untimed
done
python3 benchmarks/bench_modules.py --out /tmp/bench --seqs 4096,16384 --steps 5 --rounds 5

# Call 2 (H100; with both session 23 patches): held saves in one op call against one per save, three
# processes -> modules_host_split_held_4k_session23_h100.log, topology_session23_h100.txt
for i in 1 2 3; do
  python3 benchmarks/results/modules_host_split_4k.py 4096 40 plain,modules,modules_persave,modules_untimed
done

# Call 3 (H100): kernel launch cost with the GPU idle, busy, after stalls
# -> launch_queue_cost_session23_h100.log
python3 benchmarks/results/launch_queue_cost.py 4000

# Call 4 (H200; the final library, 0ac67fc's) -> topology_session23_h200.txt,
# modules_host_split_4k_session23_h200.log, bench_modules_session23_h200.log, modules_session23_h200.json
for i in 1 2; do
  python3 benchmarks/results/modules_host_split_4k.py 4096 30 plain,modules,modules_keep
done
python3 benchmarks/bench_modules.py --out /tmp/bench --seqs 4096,16384 --steps 5 --rounds 5

# Call 5 (H200, another machine; the final library) -> modules_host_split_4k_session23_h200_call5.log,
# bench_modules_session23_h200_call5.log, modules_session23_h200_call5.json
for i in 1 2; do
  python3 benchmarks/results/modules_host_split_4k.py 4096 30 plain,modules
done
python3 benchmarks/bench_modules.py --out /tmp/bench --seqs 4096,16384 --steps 5 --rounds 7

# Call 6 (H200; the final library): copies in flight 4 / 16 / unbounded on a fast host; the head start
# (void, see README) -> modules_host_split_mif_4k_session23_h200.log,
# modules_host_split_head_start_4k_session23_h200.log
python3 benchmarks/results/modules_host_split_4k.py 4096 30 plain,modules,modules_mif16,modules_mif0,modules_keep
HOST_SPLIT_HEAD_START_MS=60 python3 benchmarks/results/modules_host_split_4k.py 4096 30 plain,modules,modules_mif0,modules_keep

# Call 7 (H100; the final library) -> modules_host_split_4k_session23_h100_call7.log,
# bench_modules_session23_h100_call7.log, modules_session23_h100_call7.json
for i in 1 2; do
  python3 benchmarks/results/modules_host_split_4k.py 4096 30 plain,modules
done
python3 benchmarks/bench_modules.py --out /tmp/bench --seqs 4096,16384 --steps 5 --rounds 7

# Call 8 (H100; the final library; bench_modules with its new forward host time column)
# -> bench_modules_session23_h100_call8.log, modules_session23_h100_call8.json
python3 benchmarks/bench_modules.py --out /tmp/bench --seqs 4096,16384 --steps 5 --rounds 7
