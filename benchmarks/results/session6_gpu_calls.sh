# Session 6 (2026-11-23): the device calls, in order. Each ran in the repository root on the device machine
# with build/libtorch_offload.so and build/tests/torch_offload_tests (built on the development machine) and .gpu/ carried; $OUT is the device's output folder.

# --- s6call1.sh (nvidia-h100-x1)
# Session 6, call 1 (H100): the keep-on-device window (keep_on_device_bytes): C++ tests and every CUDA
# pytest case; 16k hidden_states / selective with and without saves kept (3 interleaved rounds);
# auto at 16k (its kept trial); modules *.self_attn at 4k/16k with 0 / 0.15 GB kept.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$PWD/build
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest.log
(cd python_tests && timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda . 2>&1 | tail -15) > $OUT/pytest_cuda_all.log; tail -6 $OUT/pytest_cuda_all.log
timeout 190 python3 benchmarks/bench_selective.py --out /tmp/s16k --seqs 16384 --rounds 3 --steps 3 --warmup 1 --variants ckpt,hidden,hidden@1.4,selective,selective@1.3,sel:attention+qkv+out_proj,sel:attention+qkv+out_proj@0.7,sel:attention+qkv+out_proj@1.3 2>&1 | grep -E "^\| 16384" | head -10
cp /tmp/s16k/selective_h100.md $OUT/keep_16k_h100.md; cp /tmp/s16k/selective_h100.json $OUT/keep_16k_h100.json
timeout 100 python3 benchmarks/bench_selective.py --out /tmp/sa --seqs 16384 --steps 3 --warmup 1 --variants ckpt,auto 2>&1 | grep -E "^\| 16384|auto \(" | head -5
cp /tmp/sa/selective_h100.md $OUT/keep_auto_16k_h100.md
timeout 120 python3 benchmarks/bench_modules.py --out /tmp/mod --seqs 4096,16384 --steps 5 --keep-gb 0,0.15 2>&1 | grep -E "^\| (4096|16384)" | head -8
cp /tmp/mod/modules_h100.md $OUT/keep_modules_h100.md; cp /tmp/mod/modules_h100.json $OUT/keep_modules_h100.json

# --- s6call2.sh (nvidia-h100-x1)
# Session 6, call 2 (H100): keep-on-device CUDA tests (fixed window sizes); 16k selective with windows of
# 0.35 / 0.7 / 1.0 GB (5 interleaved rounds); auto at 16k and on the Llama-3-8B shape at 8k (trials timed
# as the fastest of two steps, the kept trial); hidden_states at 16k / 32k (3 rounds).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python_tests && timeout 100 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_keep_on_device.py test_auto.py 2>&1 | tail -15) > $OUT/pytest_cuda_keep.log; tail -4 $OUT/pytest_cuda_keep.log
timeout 200 python3 benchmarks/bench_selective.py --out /tmp/s16k --seqs 16384 --rounds 5 --steps 3 --warmup 1 --variants ckpt,selective,selective@0.7,sel:attention+qkv+out_proj,sel:attention+qkv+out_proj@0.35,sel:attention+qkv+out_proj@0.7,sel:attention+qkv+out_proj@1.0 2>&1 | grep -E "^\| 16384" | head -10
cp /tmp/s16k/selective_h100.md $OUT/keep_16k_rounds_h100.md; cp /tmp/s16k/selective_h100.json $OUT/keep_16k_rounds_h100.json
timeout 100 python3 benchmarks/bench_selective.py --out /tmp/sa --seqs 16384 --steps 3 --warmup 1 --variants ckpt,auto 2>&1 | grep -E "^\| 16384|auto \(" | head -5
cp /tmp/sa/selective_h100.md $OUT/keep_auto_16k_h100.md
timeout 170 python3 benchmarks/bench_selective.py --out /tmp/s8b --shape llama3_8b --seqs 8192 --steps 3 --warmup 1 --variants ckpt,auto 2>&1 | grep -E "^\| 8192|auto \(" | head -5
cp /tmp/s8b/selective_h100_llama3_8b.md $OUT/keep_auto_llama3_8b_h100.md

# --- s6call3.sh (nvidia-h100-x1)
# Session 6, call 3 (H100): where offload_restore's host time goes (profiled restore loop); CUDA tests of
# the window and auto after the kept-trial change; auto at 16k (kept trials for the candidates within
# 3% of the fastest, a window of two blocks); 64k "attention+qkv+out_proj" with a 1 GB window.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 .gpu/restore_cost.py > $OUT/restore_cost_h100.log 2>&1; head -60 $OUT/restore_cost_h100.log
(cd python_tests && timeout 100 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_keep_on_device.py test_auto.py 2>&1 | tail -15) > $OUT/pytest_cuda_keep.log; tail -4 $OUT/pytest_cuda_keep.log
timeout 120 python3 benchmarks/bench_selective.py --out /tmp/sa --seqs 16384 --steps 3 --warmup 1 --variants ckpt,auto 2>&1 | grep -E "^\| 16384|auto \(" | head -5
cp /tmp/sa/selective_h100.md $OUT/keep_auto_16k_h100.md; cp /tmp/sa/selective_h100.json $OUT/keep_auto_16k_h100.json
timeout 200 python3 benchmarks/bench_selective.py --out /tmp/s64 --seqs 65536 --steps 2 --warmup 1 --variants ckpt,sel:attention+qkv+out_proj,sel:attention+qkv+out_proj@1.0 2>&1 | grep -E "^\| 65536" | head -5
cp /tmp/s64/selective_h100.md $OUT/keep_64k_h100.md; cp /tmp/s64/selective_h100.json $OUT/keep_64k_h100.json
# (.gpu/restore_cost.py is committed as benchmarks/results/restore_cost.py)

# --- s6call4.sh (nvidia-h100-x1)
# Session 6, call 4 (H100): auto at 16k in 3 interleaved rounds (each round plans again); host time per
# offload op with the GPU busy on long products (op_host_cost.py fixed); bf16 gradients of all / sync /
# disk / modules against the noise floor at 4k (after session 5's save-path change).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 benchmarks/op_host_cost.py --json $OUT/op_host_cost_long_products_h100.json 2>&1 | tail -3
timeout 150 python3 benchmarks/bench_activations.py --out /tmp/act --seqs 4096 --variants none,modules --steps 3 --warmup 1 --soak-steps 2 2>&1 | grep -E "^\| 4096|Gradients" | head -6
cp /tmp/act/activations_h100.md $OUT/noise_all_modules_h100.md; cp /tmp/act/activations_h100.json $OUT/noise_all_modules_h100.json
timeout 300 python3 benchmarks/bench_selective.py --out /tmp/sa --seqs 16384 --rounds 3 --steps 3 --warmup 1 --variants ckpt,auto 2>&1 | grep -E "^\| 16384|auto \(" | head -8
cp /tmp/sa/selective_h100.md $OUT/keep_auto_16k_rounds_h100.md; cp /tmp/sa/selective_h100.json $OUT/keep_auto_16k_rounds_h100.json

# --- s6call5.sh (nvidia-h100-x1)
# Session 6, call 5 (H100): modules *.self_attn with bench_modules timing whole training steps (the
# forward no longer waits for its copies in the timed steps), 3 interleaved rounds, 0 / 0.15 GB kept.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 benchmarks/bench_modules.py --out /tmp/mod --seqs 4096,16384 --steps 5 --rounds 3 --keep-gb 0,0.15 2>&1 | grep -E "^\| (4096|16384)" | head -8
cp /tmp/mod/modules_h100.md $OUT/modules_whole_steps_h100.md; cp /tmp/mod/modules_h100.json $OUT/modules_whole_steps_h100.json

# --- s6call6.sh (nvidia-h100-x1)
# Session 6, call 6 (H100): modules *.self_attn at 4k in both benchmarks on one machine (bench_activations
# measured 1.11x plain in call 4, bench_modules 1.44-1.51x in call 5 on another instance); host CPU model.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
for i in 1 2; do
timeout 100 python3 benchmarks/bench_activations.py --out /tmp/act --seqs 4096 --variants none,modules --steps 5 --warmup 1 --soak-steps 2 --no-noise 2>&1 | grep -E "^\| 4096" | head -3
timeout 100 python3 benchmarks/bench_modules.py --out /tmp/mod --seqs 4096 --steps 5 --rounds 2 2>&1 | grep -E "^\| 4096" | head -3
done
cp /tmp/act/activations_h100.json $OUT/modules_4k_bench_activations_h100.json; cp /tmp/mod/modules_h100.json $OUT/modules_4k_bench_modules_h100.json

# --- s6call7.sh (nvidia-h100-x1)
# Session 6, call 7 (H100): where a 16k step's time goes under torch's checkpoint, hidden_states,
# selective "attention" and torch's SAC: one profiled step each, the compute stream's busy time and
# idle gaps from the trace (.gpu/gaps16k.py).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 .gpu/gaps16k.py 16384 ckpt,hidden,selective,torch_sac,ckpt,hidden 2>&1 | grep -v Warning | tee $OUT/gaps_16k_h100.log | tail -8
# (.gpu/gaps16k.py is committed as benchmarks/results/gaps16k.py)

# --- s6call8.sh (nvidia-h100-x1)
# Session 6, call 8 (H100): as call 7 for checkpointing and hidden_states, with where the largest idle gaps of the compute stream are (ms from the step start, the kernels around them) and gaps by phase.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 .gpu/gaps16k.py 16384 ckpt,hidden,ckpt,hidden 2>&1 | grep -v Warning | tee $OUT/gaps_16k_where_h100.log | tail -8

# --- s6call9.sh (nvidia-h100-x1)
# Session 6, call 9 (H100): the link budget (keep_on_device_bytes="auto": each step's window = what the
# link could not carry during the forward) in `all` and `modules` modes at 4k and 16k, beside the same
# modes without it, plain training and TRL 1.16's OffloadActivations (carried wheel), one process.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
timeout 400 python3 benchmarks/bench_activations.py --out /tmp/act --seqs 4096,16384 --variants none,all,all:auto,modules,modules:auto,trl --skip trl@4096 --no-noise --soak-steps 2 --warmup 1 --steps 3 2>&1 | grep -E "^\| (4096|16384)|TRL" | head -16
cp /tmp/act/activations_h100.md $OUT/link_budget_h100.md; cp /tmp/act/activations_h100.json $OUT/link_budget_h100.json

# --- s6call10.sh (nvidia-h100-x1)
# Session 6, call 10 (H100): the link budget after it subtracts the forward's stall on copies from its
# time (call 9 sized every window 0: a link-bound forward takes as long as its copies), in `all` and
# `modules` modes at 4k and 16k, beside the same modes without it and plain training, one process.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 benchmarks/bench_activations.py --out /tmp/act --seqs 4096,16384 --variants none,all,all:auto,modules,modules:auto --no-noise --soak-steps 2 --warmup 2 --steps 3 2>&1 | grep -E "^\| (4096|16384)" | head -16
cp /tmp/act/activations_h100.md $OUT/link_budget_stall_h100.md; cp /tmp/act/activations_h100.json $OUT/link_budget_stall_h100.json

# --- s6call11.sh (nvidia-h100-x1)
# Session 6, call 11 (H100): C++ tests with CUDA and the CUDA pytest cases of the window, the link budget
# and auto, on the final build.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$PWD/build
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest.log
(cd python_tests && timeout 300 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda . 2>&1 | tail -15) > $OUT/pytest_cuda_all.log; tail -4 $OUT/pytest_cuda_all.log

# --- s6call12.sh (nvidia-h100-x1)
# Session 6, call 12 (H100): hidden_states against torch's checkpoint at 16k and 32k, 3 interleaved
# rounds, also with a 0.14 GB window (the last block inputs kept: no wait at the turn to backward).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 benchmarks/bench_selective.py --out /tmp/hs --seqs 16384,32768 --rounds 3 --steps 3 --warmup 1 --variants ckpt,hidden,hidden@0.14 2>&1 | grep -E "^\| (16384|32768)" | head -8
cp /tmp/hs/selective_h100.md $OUT/hidden_16k_32k_rounds_h100.md; cp /tmp/hs/selective_h100.json $OUT/hidden_16k_32k_rounds_h100.json

# --- s6call13.sh (nvidia-h100-x1)
# Session 6, call 13 (H100): C++ tests with CUDA after the disk-restore prefetch fix, three times.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$PWD/build
nvidia-smi --query-gpu=name --format=csv,noheader
for i in 1 2 3; do timeout 100 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest_$i.log 2>&1; echo "gtest rc=$?"; tail -1 $OUT/gtest_$i.log; done
(cd python_tests && timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_keep_on_device.py test_disk_files.py test_activations.py 2>&1 | tail -4) > $OUT/pytest_cuda.log; tail -2 $OUT/pytest_cuda.log

# --- s6call14.sh (nvidia-h100-x1)
# Session 6, call 14 (H100): after the review (auto's predicted peak derived from the plan; the window's
# entry flag derived from its kept source): C++ tests with CUDA and the CUDA cases of the window and auto.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$PWD/build
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest.log 2>&1; echo "gtest rc=$?"; tail -1 $OUT/gtest.log
(cd python_tests && timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_keep_on_device.py test_auto.py test_activations.py test_selective.py 2>&1 | tail -4) > $OUT/pytest_cuda.log; tail -2 $OUT/pytest_cuda.log
