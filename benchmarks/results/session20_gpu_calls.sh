# Session 20 (2026-11-24): the GPU calls, in order; each ran as `bash .gpu/s20callN.sh` on nvidia-h100-x1 with carry
# [build/libtorch_offload.so, build/_save_hooks.cpython-312-x86_64-linux-gnu.so, .gpu] (call 1 also .whl: the
# py-spy 0.4.1 wheel, downloaded here). The library was built here from 241f356 (session 19's final code) by
# `bash scripts/demo.sh`; the Python 3.12 save hooks with
#   cmake -S . -B /tmp/build-py312 -G Ninja -DPython3_EXECUTABLE=/root/.pyenv/versions/3.12.1/bin/python3 \
#     -DTorch_DIR=$HOME/.cache/torch_offload/venv/lib/python3.11/site-packages/torch/share/cmake/Torch \
#     -DTORCH_OFFLOAD_BUILD_TESTS=OFF -DTORCH_OFFLOAD_BUILD_EXAMPLES=OFF
#   cmake --build /tmp/build-py312 --target torch_offload_save_hooks
# then copied to build/ and both stripped of debug info (strip --strip-debug).
# The logs were committed under session-20 names: $OUT/stepwise_16k_window.log -> stepwise_16k_attention_window_session20_h100.log,
# stepwise_4k_modules_keep.log -> stepwise_4k_modules_keep_session20_h100.log, dma_host_effect_4k.log -> dma_host_effect_4k_session20_h100.log
# (and _3gb), dma_host_micro.log, host_sync_profile_4k.log, stepwise_16k_sac.log, stepwise_32k_window.log and
# dma_host_effect_l0_4k.log likewise with _session20_h100, stepwise_16k_sac_24.log -> stepwise_16k_sac_24_session20_h100.log, modules_timeline_4k.log -> modules_timeline_4k_session20_h100.log, pack_cost_cuda.log -> pack_cost_cuda_session20_h100.log; call 10's profiles -> modules_4k_{modules_keep,modules}_pyspy_session20_h100.txt.gz
# (its two loop logs' last lines -> modules_loop_4k_pyspy_session20_h100.log), call 11's log -> modules_loop_4k_back_to_back_session20_h100.log, call 12's -> modules_process_spread_4k_session20_h100.log. Call 1's py-spy runs hit the 600 s limit and left nothing.
# Call 2 ran dma_host_effect.py before its _l0 variants were added (the step's d2h / h2d copies were queued the same way).

### call 1
# Session 20, call 1 (H100): "attention" at 16k with small keep windows, step by step; where the 4k
# modules step's host time goes (py-spy, native frames), and its decomposition (hooks kept vs copies).
set -x
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
python3 benchmarks/results/stepwise_models_issue10.py 16384 20 ckpt,hidden,selective,selective@0.13,selective@0.26,selective@0.35 2>&1 | grep -v Warning | tee $OUT/stepwise_16k_window.log
python3 benchmarks/results/stepwise_models_issue10.py 4096 60 plain,modules_keep,modules 2>&1 | grep -v Warning | tee $OUT/stepwise_4k_modules_keep.log
pip install --no-deps -q .whl/py_spy*.whl 2>&1 | tail -1
py-spy record --native --threads -r 200 -f raw -o $OUT/modules4k.raw -- python3 benchmarks/results/stepwise_models_issue10.py 4096 60 modules 2>&1 | tail -4
py-spy record --native --threads -r 200 -f raw -o $OUT/plain4k.raw -- python3 benchmarks/results/stepwise_models_issue10.py 4096 60 plain 2>&1 | tail -4
gzip -k $OUT/*.raw 2>/dev/null; rm -f $OUT/*.raw
ls -la $OUT

### call 2
# Session 20, call 2 (H100): does DMA traffic alone slow the host-bound 4k step (plain training with
# 1.6 GB of side-stream copies each step, beside modules)? The host's CPUs and NUMA layout.
set -x
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
lscpu | head -30; numactl -H 2>/dev/null | head; nvidia-smi topo -m 2>/dev/null | head
python3 benchmarks/results/dma_host_effect.py 4096 60 1.6 plain,d2h,h2d,modules 2>&1 | grep -v Warning | tee $OUT/dma_host_effect_4k.log
python3 benchmarks/results/dma_host_effect.py 4096 40 3.2 plain,d2h 2>&1 | grep -v Warning | tee $OUT/dma_host_effect_4k_3gb.log

### call 3
# Session 20, call 3 (H100): which host work does device-to-host DMA slow (interpreter, kernel
# launches, host memory copies; destination spread or cache-resident)?
set -x
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
python3 benchmarks/results/dma_host_micro.py 1.5 15 2>&1 | tee $OUT/dma_host_micro.log

### call 4
# Session 20, call 4 (H100): where the host waits in a 4k step: plain, modules, plain + 1.5 GB d2h.
set -x
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
python3 -c "import transformers; print('transformers', transformers.__version__)"
python3 benchmarks/results/host_sync_profile.py 4096 5 plain,modules,d2h 2>&1 | grep -v "Warning: \|warnings.warn" | tee $OUT/host_sync_profile_4k.log

### call 5
# Session 20, call 5 (H100): issue 10's two open targets beside what bounds them, step by step:
# 16k: torch's SAC keeping the attention outputs on the GPU (the "attention" policy with no copy),
# our "attention", hidden_states and hidden_states without copies; 32k: hidden_states, without
# copies, and with a 0.5 GB window (the last four blocks' inputs stay on the GPU).
set -x
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
python3 benchmarks/results/stepwise_models_issue10.py 16384 16 ckpt,torch_sac,selective,hidden,hidden_nocopy 2>&1 | grep -v Warning | tee $OUT/stepwise_16k_sac.log
python3 benchmarks/results/stepwise_models_issue10.py 32768 10 ckpt,hidden,hidden_nocopy,hidden@0.5 2>&1 | grep -v Warning | tee $OUT/stepwise_32k_window.log

### call 6
# Session 20, call 6 (H100): DMA traffic during a 4k forward that has passed its synchronizing call:
# does device-to-host traffic slow the host-bound forward, and does a cache-resident destination?
set -x
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
python3 benchmarks/results/dma_host_effect.py 4096 60 1.6 plain,d2h_l0,d2h_small_l0,h2d_l0,modules 2>&1 | grep -v Warning | tee $OUT/dma_host_effect_l0_4k.log

### call 7
# Session 20, call 7 (H100): issue 10's "attention" target at 16k beside its no-copy bound again, on
# whichever machine this call gets: checkpointing, torch's SAC keeping the attention outputs on the
# GPU, our "attention", 24 sets.
set -x
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
python3 benchmarks/results/stepwise_models_issue10.py 16384 24 ckpt,torch_sac,selective 2>&1 | grep -v Warning | tee $OUT/stepwise_16k_sac_24.log

### call 8
# Session 20, call 8 (H100): the 4k modules step on the GPU's timeline (plain, modules_keep, modules).
set -x
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
python3 benchmarks/results/modules_timeline_4k.py 4096 5 2>&1 | grep -v Warning | tee $OUT/modules_timeline_4k.log

### call 9
# Session 20, call 9 (H100): one save's host time through the engine, without a model (pack_cost_cuda.py).
set -x
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
python3 benchmarks/results/pack_cost_cuda.py 120 10 2>&1 | tee $OUT/pack_cost_cuda.log

### call 10
# Session 20, call 10 (H100): py-spy (native) over the 4k loop, modules with every save kept against
# modules, to see where the copying saves' extra forward time goes (pyspy_diff.py here).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
pip install -q --no-deps .whl/py_spy*.whl 2>&1 | tail -1
for mode in modules_keep modules; do
  python3 benchmarks/results/modules_loop_4k.py 350 $mode > $OUT/modules_loop_4k_${mode}_s20.log 2>&1 &
  pid=$!
  sleep 22
  timeout 60 py-spy record --native --format raw --rate 200 -d 12 --pid $pid -o $OUT/modules_4k_${mode}_pyspy_s20.txt > /dev/null 2>&1
  wait $pid; tail -1 $OUT/modules_loop_4k_${mode}_s20.log
  gzip $OUT/modules_4k_${mode}_pyspy_s20.txt
done
ls -la $OUT

### call 11
# Session 20, call 11 (H100): the 4k loop back to back (no synchronization between steps), unsampled:
# plain, modules_keep, modules, twice.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for mode in none modules_keep modules none modules_keep modules; do
  python3 benchmarks/results/modules_loop_4k.py 150 $mode 2>&1 | grep "per step"
done | tee $OUT/modules_loop_4k_back_to_back.log

### call 12
# Session 20, call 12 (H100): the 4k modules ratio in 5 processes, each with its link's measured speed.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for i in 1 2 3 4 5; do
  python3 benchmarks/results/modules_process_spread_4k.py 30 2>&1 | grep "^pid"
done | tee $OUT/modules_process_spread_4k.log

### call 13 (run directly, building everything on the GPU machine)
SKIP_BENCH=1 bash benchmarks/gpu_check.sh $OUT > $OUT/gpu_check_session20.log 2>&1
