#!/bin/bash
# Session 7: the scripts of each device call, in order (run from the repository root with OUT set; .gpu/ is not committed).

# --- s7call1.sh (nvidia-h100-x1)
# Session 7, call 1 (H100): auto's unchecked tail and early-peak window. CUDA tests of auto, the tail
# and the window; then the Llama-3-8B shape at 8k, checkpointing against auto, with the model's own
# loss and with the loss in chunks (every variant, checkpointing too).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python_tests && timeout 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_auto_tail.py test_auto.py test_keep_on_device.py 2>&1 | tail -30) > $OUT/pytest_cuda.log; tail -3 $OUT/pytest_cuda.log
timeout 210 python3 benchmarks/bench_selective.py --out /tmp/s8b --shape llama3_8b --seqs 8192 --steps 3 --warmup 1 --variants ckpt,auto 2>&1 | grep -E "^\| 8192|auto \(budget" | cut -c1-1500
cp /tmp/s8b/selective_h100_llama3_8b.md /tmp/s8b/selective_h100_llama3_8b.json $OUT/ 2>/dev/null
timeout 210 python3 benchmarks/bench_selective.py --out /tmp/s8b --shape llama3_8b --seqs 8192 --steps 3 --warmup 1 --variants ckpt,auto --chunked-loss 2>&1 | grep -E "^\| 8192|auto \(budget" | cut -c1-1500
cp /tmp/s8b/selective_h100_llama3_8b_chunked_loss.md /tmp/s8b/selective_h100_llama3_8b_chunked_loss.json $OUT/ 2>/dev/null

# --- s7call2.sh (nvidia-h100-x1)
# Session 7, call 2 (H100): auto trading part of its window for one more unchecked block; Llama-3-8B
# shape at 8k (the model's own loss), then the reference model at 16k in 2 interleaved rounds.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python_tests && timeout 100 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_auto_tail.py 2>&1 | tail -3) > $OUT/pytest_cuda.log; tail -1 $OUT/pytest_cuda.log
timeout 220 python3 benchmarks/bench_selective.py --out /tmp/s8b --shape llama3_8b --seqs 8192 --steps 3 --warmup 1 --variants ckpt,auto 2>&1 | grep -E "^\| 8192|auto \(budget" | cut -c1-1500
cp /tmp/s8b/selective_h100_llama3_8b.md /tmp/s8b/selective_h100_llama3_8b.json $OUT/ 2>/dev/null
timeout 250 python3 benchmarks/bench_selective.py --out /tmp/s16 --seqs 16384 --rounds 2 --steps 3 --warmup 1 --variants ckpt,auto 2>&1 | grep -E "^\| 16384|auto \(budget" | cut -c1-1500
cp /tmp/s16/selective_h100.md $OUT/auto_16k_tail_h100.md; cp /tmp/s16/selective_h100.json $OUT/auto_16k_tail_h100.json

# --- s7call3.sh (nvidia-h100-x1)
# Session 7, call 3 (H100): issue 8, what holds compiled selective's late-backward peak at 16k:
# memory snapshots of compiled checkpointing and torch_offload.compile(selective) (prefetch 3, the
# default, and 1), the live allocations at each peak by category and by allocating line.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 560 python3 benchmarks/peak_memory.py --out /tmp/pm --layers 24 --seqs 16384 --top 30 --variants ckpt_compiled,ours_selective_compiled,ours_selective_compiled_prefetch1 > $OUT/peak_memory_selective_16k_categories_h100.log 2>&1
echo rc=$?; grep -E "^===|\[|-- " $OUT/peak_memory_selective_16k_categories_h100.log | cut -c1-160
cp /tmp/pm/peak_memory.json $OUT/peak_memory_selective_16k_categories_h100.json

# --- s7call4.sh (nvidia-h100-x1)
# Session 7, call 4 (H100): issue 8 again: compiled checkpointing and compiled selective at 16k
# compared at the same progress through backward (allocated GB at each 5% of its events), and the
# generated backward code of compiled selective (the lines its peak allocations come from).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/torchinductor_*
timeout 400 python3 benchmarks/peak_memory.py --out /tmp/pm --layers 24 --seqs 16384 --top 40 --variants ckpt_compiled,ours_selective_compiled > $OUT/peak_memory_selective_16k_profile_h100.log 2>&1
echo rc=$?; grep -E "^===|\[|-- |allocated GB at" $OUT/peak_memory_selective_16k_profile_h100.log | cut -c1-300
cp /tmp/pm/peak_memory.json $OUT/peak_memory_selective_16k_profile_h100.json
for f in $(grep -l "offload_restore" /tmp/torchinductor_*/*/*.py | xargs ls -S | head -2); do cp $f $OUT/; done
ls -la $OUT

# --- s7call5.sh (nvidia-h100-x1)
# Session 7, call 5 (H100): the final code: every CUDA pytest case; then the Llama-3-8B shape at 8k,
# checkpointing against auto in 2 interleaved rounds (auto plans anew in each).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python_tests && timeout 280 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda . 2>&1 | tail -15) > $OUT/gpu_pytest_cuda_h100_session7_final.log; tail -3 $OUT/gpu_pytest_cuda_h100_session7_final.log
timeout 290 python3 benchmarks/bench_selective.py --out /tmp/s8b --shape llama3_8b --seqs 8192 --rounds 2 --steps 3 --warmup 1 --variants ckpt,auto 2>&1 | grep -E "^\| 8192|auto \(budget" | cut -c1-1500
cp /tmp/s8b/selective_h100_llama3_8b.md $OUT/auto_tail_llama3_8b_rounds_h100.md; cp /tmp/s8b/selective_h100_llama3_8b.json $OUT/auto_tail_llama3_8b_rounds_h100.json

# --- s7call6.sh (nvidia-h100-x1)
# Session 7, call 6 (H100): the loss's gradients computed in the forward. Llama-3-8B shape at 8k, one
# process: checkpointing with the model's own loss, checkpointing and auto with the chunked loss
# computing its gradients in forward, 2 interleaved rounds; then the reference model at 16k the same.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 benchmarks/bench_selective.py --out /tmp/s8b --shape llama3_8b --seqs 8192 --rounds 2 --steps 3 --warmup 1 --variants ckpt,ckpt/grads_in_forward,auto/grads_in_forward 2>&1 | grep -E "^\| 8192|auto \(budget" | cut -c1-1800
cp /tmp/s8b/selective_h100_llama3_8b.md $OUT/auto_loss_grads_in_forward_llama3_8b_h100.md; cp /tmp/s8b/selective_h100_llama3_8b.json $OUT/auto_loss_grads_in_forward_llama3_8b_h100.json
timeout 200 python3 benchmarks/bench_selective.py --out /tmp/s16 --seqs 16384 --rounds 2 --steps 3 --warmup 1 --variants ckpt,ckpt/grads_in_forward,auto/grads_in_forward 2>&1 | grep -E "^\| 16384|auto \(budget" | cut -c1-1800
cp /tmp/s16/selective_h100.md $OUT/auto_loss_grads_in_forward_16k_h100.md; cp /tmp/s16/selective_h100.json $OUT/auto_loss_grads_in_forward_16k_h100.json

# --- s7call7.sh (nvidia-h100-x1)
# Session 7, call 7 (H100): reference model at 16k, auto with the loss's gradients computed in forward
# and its budget set to checkpointing's peak with the model's own loss (measured just before it in
# the same process), 2 interleaved rounds.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 benchmarks/bench_selective.py --out /tmp/s16 --seqs 16384 --rounds 2 --steps 3 --warmup 1 --variants ckpt,auto/grads_in_forward --auto-budget-gb ckpt 2>&1 | grep -E "^\| 16384|auto \(budget" | cut -c1-2000
cp /tmp/s16/selective_h100.md $OUT/auto_loss_grads_in_forward_16k_ckpt_budget_h100.md; cp /tmp/s16/selective_h100.json $OUT/auto_loss_grads_in_forward_16k_ckpt_budget_h100.json
