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
