#!/bin/bash
# Session 10's device calls, in order (nvidia-h100-x1; the library built on the development machine and
# carried as build/libtorch_offload.so, call 1 also build/tests/torch_offload_tests). Call 6's 16k run hit
# its 300 s limit during its fourth variant (ours_selective_causal, no file); call 7 ran that again.

# ===== call 1: .gpu/s10call1.sh
# Session 10, call 1 (H100): the C++ suite with CUDA after the finish_save drop fix; issue 8: the most
# that offloading the boundaries can free on compiled checkpointing's own schedule (peak_memory.py's
# boundary_bound) at 16k / 32k / 64k, eager checkpointing at 16k beside it; then compiled checkpointing
# and compiled selective at 16k with comparable compile times (empty caches per variant).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/cpp_tests_cuda_h100_session10.log 2>&1; echo cpp rc=$?; tail -3 $OUT/cpp_tests_cuda_h100_session10.log
timeout 320 python3 benchmarks/peak_memory.py --out /tmp/pm --layers 24 --seqs 16384 --variants ckpt_eager,ckpt_compiled > $OUT/boundary_bound_h100.log 2>&1; echo pm16 rc=$?
timeout 300 python3 benchmarks/peak_memory.py --out /tmp/pm2 --layers 24 --seqs 32768,65536 --variants ckpt_compiled >> $OUT/boundary_bound_h100.log 2>&1; echo pm rc=$?
grep -E "^=== |boundaries taken out" $OUT/boundary_bound_h100.log
cp /tmp/pm/peak_memory.json $OUT/boundary_bound_16k_h100.json 2>/dev/null; cp /tmp/pm2/peak_memory.json $OUT/boundary_bound_32k_64k_h100.json 2>/dev/null
ls $OUT

# ===== call 2: .gpu/s10call2.sh
# Session 10, call 2 (H100): issue 8 with comparable compile times (each variant from empty inductor and
# Triton caches, compile workers started before the first): 16k compiled checkpointing and compiled
# selective, then 32k compiled checkpointing, ours hidden_states and ours selective, in one process.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 python3 benchmarks/bench_compile.py --out /tmp/c --seqs 16384 --variants ckpt_compiled,ours_compiled,ours_selective --steps 2 > $OUT/compile_cold_caches_h100.log 2>&1; echo rc=$?
timeout 280 python3 benchmarks/bench_compile.py --out /tmp/c32 --seqs 32768 --variants ckpt_compiled,ours_selective --steps 2 > $OUT/compile_cold_caches_32k_h100.log 2>&1; echo rc32=$?
for f in /tmp/c32/compile_*; do cp $f $OUT/compile_cold_caches_32k_h100.${f##*.}; done
grep -hE "^\{" $OUT/compile_cold_caches_h100.log $OUT/compile_cold_caches_32k_h100.log | cut -c1-400
cp /tmp/c/*.md /tmp/c/*.json $OUT/ 2>/dev/null
ls $OUT

# ===== call 3: .gpu/s10call3.sh
# Session 10, call 3 (H100): issue 8 at 64k with comparable compile times (compiled checkpointing,
# ours selective, ours hidden_states; one measured step each); issue 13: hidden_states through the
# disk tier at 64k (page cache), beside checkpointing.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 380 python3 benchmarks/bench_compile.py --out /tmp/c64 --seqs 65536 --variants ckpt_compiled,ours_selective,ours_compiled --steps 1 > $OUT/compile_cold_caches_64k_h100.log 2>&1; echo rc64=$?
for f in /tmp/c64/compile_*; do cp $f $OUT/compile_cold_caches_64k_h100.${f##*.}; done
grep -hE "^\{" $OUT/compile_cold_caches_64k_h100.log | cut -c1-400
timeout 150 python3 -m torch_offload.bench --modes checkpointing,hidden_states_disk --seqs 65536 --steps 4 --warmup 1 --disk-dir /tmp --json $OUT/bench_cli_disk_64k_h100_session10.json --no-progress > $OUT/bench_cli_disk_64k_h100_session10.log 2>&1; echo disk rc=$?
tail -12 $OUT/bench_cli_disk_64k_h100_session10.log | cut -c1-300
ls $OUT

# ===== call 4: .gpu/s10call4.sh
# Session 10, call 4 (H100): issue 8: compiled checkpointing with inductor's buffer reuse off (the
# option torch_offload.compile sets) at 32k and 64k, and ours hidden_states at 32k, beside compiled
# checkpointing; issue 13: hidden_states through the disk tier at 64k, second run.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 benchmarks/bench_compile.py --out /tmp/c32 --seqs 32768 --variants ckpt_compiled,ckpt_compiled_noreuse,ours_compiled --steps 1 > $OUT/compile_noreuse_32k_h100.log 2>&1; echo rc32=$?
for f in /tmp/c32/compile_*; do cp $f $OUT/compile_noreuse_32k_h100.${f##*.}; done
grep -hE "^\{" $OUT/compile_noreuse_32k_h100.log | cut -c1-330
timeout 150 python3 -m torch_offload.bench --modes checkpointing,hidden_states_disk --seqs 65536 --steps 4 --warmup 1 --disk-dir /tmp --json $OUT/bench_cli_disk_64k_h100_session10_run2.json --no-progress > $OUT/bench_cli_disk_64k_h100_session10_run2.log 2>&1; echo disk rc=$?
tail -6 $OUT/bench_cli_disk_64k_h100_session10_run2.log | cut -c1-300
ls $OUT

# ===== call 5: .gpu/s10call5.sh
# Session 10, call 5 (H100): issue 8: compiled checkpointing with inductor's buffer reuse off at 64k
# and 16k beside compiled checkpointing's default (one measured step at 64k).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 benchmarks/bench_compile.py --out /tmp/c64 --seqs 65536 --variants ckpt_compiled_noreuse --steps 1 > $OUT/compile_noreuse_64k_h100.log 2>&1; echo rc64=$?
for f in /tmp/c64/compile_*; do cp $f $OUT/compile_noreuse_64k_h100.${f##*.}; done
timeout 90 python3 benchmarks/bench_compile.py --out /tmp/c16 --seqs 16384 --variants ckpt_compiled_noreuse --steps 2 > $OUT/compile_noreuse_16k_h100.log 2>&1; echo rc16=$?
for f in /tmp/c16/compile_*; do cp $f $OUT/compile_noreuse_16k_h100.${f##*.}; done
grep -hE "^\{" $OUT/compile_noreuse_*_h100.log | cut -c1-330

# ===== call 6: .gpu/s10call6.sh
# Session 10, call 6 (H100): issue 8 with torch_offload.sdpa_is_causal (no dense causal mask under
# compile): its tests against this machine's transformers; 16k: compiled checkpointing as torch.compile
# gives it, the same with sdpa_is_causal, ours hidden_states and selective with it; 64k: compiled
# checkpointing with it and ours hidden_states with it (one measured step).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
(cd python_tests && timeout 90 python3 -m pytest -q -rf --tb=short -p no:cacheprovider test_hf_causal_mask.py 2>&1 | tail -8) > $OUT/pytest_hf_causal_mask_h100.log; tail -3 $OUT/pytest_hf_causal_mask_h100.log
timeout 300 python3 benchmarks/bench_compile.py --out /tmp/c16 --seqs 16384 --variants ckpt_compiled,ckpt_compiled_causal,ours_compiled_causal,ours_selective_causal --steps 2 > $OUT/compile_causal_16k_h100.log 2>&1; echo rc16=$?
for f in /tmp/c16/compile_*; do cp $f $OUT/compile_causal_16k_h100.${f##*.}; done
grep -hE "^\{" $OUT/compile_causal_16k_h100.log | cut -c1-330
timeout 200 python3 benchmarks/bench_compile.py --out /tmp/c64 --seqs 65536 --variants ckpt_compiled_causal,ours_compiled_causal --steps 1 > $OUT/compile_causal_64k_h100.log 2>&1; echo rc64=$?
for f in /tmp/c64/compile_*; do cp $f $OUT/compile_causal_64k_h100.${f##*.}; done
grep -hE "^\{" $OUT/compile_causal_64k_h100.log | cut -c1-330

# ===== call 7: .gpu/s10call7.sh
# Session 10, call 7 (H100): what call 6's time limit cut: 16k compiled checkpointing and ours selective,
# both with sdpa_is_causal; then 32k compiled checkpointing and ours hidden_states, both with it.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 190 python3 benchmarks/bench_compile.py --out /tmp/s16 --seqs 16384 --variants ckpt_compiled_causal,ours_selective_causal --steps 2 > $OUT/compile_causal_selective_16k_h100.log 2>&1; echo rc16=$?
for f in /tmp/s16/compile_*; do cp $f $OUT/compile_causal_selective_16k_h100.${f##*.}; done
grep -hE "^\{" $OUT/compile_causal_selective_16k_h100.log | cut -c1-300
timeout 150 python3 benchmarks/bench_compile.py --out /tmp/c32 --seqs 32768 --variants ckpt_compiled_causal,ours_compiled_causal --steps 1 > $OUT/compile_causal_32k_h100.log 2>&1; echo rc32=$?
for f in /tmp/c32/compile_*; do cp $f $OUT/compile_causal_32k_h100.${f##*.}; done
grep -hE "^\{" $OUT/compile_causal_32k_h100.log | cut -c1-300
