#!/bin/bash
# The device scripts of session 4, in order (each a device call; H100 for 1-2, 2x H200 for 3-4).

# --- call 1 (nvidia-h100-x1): .gpu/call1.sh
# Session 4, call 1: where the 4k step's time goes; fast selective at 4k/16k/64k; `all` vs TRL at 16k.
set -x
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$PWD/build
nvidia-smi --query-gpu=name --format=csv,noheader
pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | tail -2
python3 -c "import trl, transformers; print('trl', trl.__version__, 'transformers', transformers.__version__)"
timeout 150 python3 benchmarks/profile_short_step.py --out /tmp/prof --seq 4096 > $OUT/profile_4k.log 2>&1; echo rc=$?
tail -8 $OUT/profile_4k.log
cp /tmp/prof/profile_4096.json $OUT/ ; (cd /tmp/prof && tar czf $OUT/traces_4k.tar.gz trace_*.json)
timeout 240 python3 benchmarks/bench_selective.py --out /tmp/sel --seqs 4096,16384,65536 --steps 3 --warmup 1 2>&1 | tail -25
cp /tmp/sel/*.md /tmp/sel/*.json $OUT/ 2>/dev/null
timeout 150 python3 benchmarks/bench_activations.py --out /tmp/act --seqs 16384 --variants none,all,trl --no-noise --soak-steps 3 --warmup 1 --steps 3 2>&1 | tail -12
cp /tmp/act/*.md /tmp/act/*.json $OUT/ 2>/dev/null
ls $OUT

# --- call 2 (nvidia-h100-x1): .gpu/call2.sh
# Session 4, call 2: selective attention_qkv beside attention; `all` vs TRL OffloadActivations at 16k.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -2
python3 -c "import trl, transformers; print('trl', trl.__version__, 'transformers', transformers.__version__)"
timeout 300 python3 benchmarks/bench_selective.py --out /tmp/sel --seqs 4096,16384,65536 --variants ckpt,hidden,selective,selective_qkv --steps 3 --warmup 1 2>&1 | tail -16
cp /tmp/sel/selective_h100.md $OUT/selective_qkv_h100.md; cp /tmp/sel/selective_h100.json $OUT/selective_qkv_h100.json
timeout 200 python3 benchmarks/bench_activations.py --out /tmp/act --seqs 16384 --variants none,all,trl --no-noise --soak-steps 3 --warmup 1 --steps 3 2>&1 | tail -10
cp /tmp/act/activations_h100.md $OUT/activations_trl_h100.md; cp /tmp/act/activations_h100.json $OUT/activations_trl_h100.json

# --- call 3 (nvidia-h200-x2): .gpu/call3.sh
# Session 4, call 3 (2x H200): FSDP2 gradients fp32/bf16 per mode; longest sequence with the chunked loss.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/fsdp2_gradients.py --out $OUT 2>&1 | grep -v "Warning\|warn" | tail -14
echo "gradients rc=${PIPESTATUS[0]}"
timeout 420 python3 -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/bench_fsdp2.py --seqs "" --longest --longest-ours hs_chunked,hs_before --longest-start 65536 --longest-max 131072 --deadline-s 330 --timeout-s 120 --out $OUT 2>&1 | grep -v "Warning\|warn" | tail -30
echo "longest rc=${PIPESTATUS[0]}"

# --- call 4 (nvidia-h200-x2)
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 400 python3 -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/bench_fsdp2.py --shape llama3_8b --seqs 65536 --variants ckpt,hs_chunked,hs_before --warmup 1 --steps 2 --deadline-s 300 --timeout-s 120 --out $OUT

# --- call 5 (nvidia-h100-x1): .gpu/call5.sh
# Session 4, call 5 (H100): CUDA tests of the new Python paths; auto on the reference model and the Llama-3-8B shape.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -2
(cd python_tests && timeout 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_selective.py test_auto.py test_checkpoint_torch_suite.py test_models.py test_compile.py -x 2>&1 | tail -8) > $OUT/pytest_cuda.log; tail -4 $OUT/pytest_cuda.log
timeout 150 python3 benchmarks/bench_selective.py --shape llama3_8b --out /tmp/sel8b --seqs 8192 --variants ckpt,hidden,selective,selective_qkv,auto --steps 3 --warmup 1 2>&1 | tail -12
cp /tmp/sel8b/*.md /tmp/sel8b/*.json $OUT/ 2>/dev/null
timeout 260 python3 benchmarks/bench_selective.py --out /tmp/sel --seqs 4096,16384,65536 --variants ckpt,hidden,selective_qkv,auto --steps 3 --warmup 1 2>&1 | tail -14
cp /tmp/sel/selective_h100.md $OUT/selective_auto_h100.md; cp /tmp/sel/selective_h100.json $OUT/selective_auto_h100.json

# --- call 6 (nvidia-h100-x1): .gpu/call6.sh (the repro script is python_tests/manager_drop_script.py)
# Session 4, call 6 (H100): does dropping a manager with copies queued hang (GIL in the releaser)? CUDA pytest on the merged main.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
for mode in drop_handles_then_manager drop_manager_then_handles; do
  timeout 60 python3 python_tests/manager_drop_script.py $mode; echo "$mode rc=$?"
done 2>&1 | tee $OUT/releaser_gil.log
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -2
(cd python_tests && timeout 420 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda . 2>&1 | tail -12) > $OUT/pytest_cuda_all.log; tail -6 $OUT/pytest_cuda_all.log

# --- call 7 (nvidia-h100-x1): .gpu/call7.sh
# Session 4, call 7 (H100): after sources are dropped on callers' threads (source_slot.h): C++ tests with CUDA,
# every CUDA pytest case (the manager-drop hang test among them), `all` at 16k (memory, speed).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$PWD/build
timeout 200 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest.log
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -2
(cd python_tests && timeout 300 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda . 2>&1 | tail -12) > $OUT/pytest_cuda_all.log; tail -4 $OUT/pytest_cuda_all.log
timeout 150 python3 benchmarks/bench_activations.py --out /tmp/act --seqs 16384 --variants all --no-noise --soak-steps 3 --warmup 1 --steps 3 2>&1 | grep "| 16384"
cp /tmp/act/activations_h100.md $OUT/activations_all_after_source_drops_h100.md; cp /tmp/act/activations_h100.json $OUT/activations_all_after_source_drops_h100.json

# --- call 8 (nvidia-h100-x1)
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 420 python3 -m torch_offload.bench --modes checkpointing,hidden_states --seqs 16384,32768 --steps 4 --warmup 1 --json $OUT/bench_cli_h100_session4.json --no-progress

# --- call 9 (nvidia-h100-x1)
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 300 python3 benchmarks/bench_selective.py --out $OUT --seqs 4096,16384 --variants ckpt,hidden,auto --steps 5 --warmup 1

# --- call 10 (nvidia-h100-x1)
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 200 python3 benchmarks/bench_modules.py --out $OUT --seqs 4096,16384 --steps 5
timeout 150 python3 benchmarks/profile_short_step.py --out /tmp/prof --seq 4096 --variants none,ckpt,hidden_states,modules > $OUT/profile_4k_after.log 2>&1

# --- call 11 (nvidia-h100-x1)
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 200 python3 benchmarks/bench_selective.py --out $OUT --seqs "" --noise-seq 4096

# --- call 12 (nvidia-h100-x1)
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
timeout 450 python3 benchmarks/peak_memory.py --out $OUT --layers 24 --seqs 16384 --variants ckpt_compiled,ours_selective_compiled > $OUT/peak_memory_selective_16k.log 2>&1
