#!/usr/bin/env bash
# Session 14's GPU calls (nvidia-h100-x1), in order; each ran as `bash .gpu/s14callN.sh $OUT` with carry
# build/libtorch_offload.so and .gpu (call 1: .gpu/old held de5faa8's library and Python tree; call 4:
# .gpu/notime held a diagnostic library with untimed compute waits and .gpu/bin the stripped C++ tests).
# Call 1 ran on de5faa8 plus benchmarks/results/session14_call1_tree.patch (the leaf path and a byte
# bound on prefetch, OffloadManager(prefetch_bytes=), since dropped); calls 2-3 on fb80642 (call 2's tree
# asked about leaves under min_bytes too); calls 4-5 on 324f5d7. Call 4's .gpu/notime library was 324f5d7
# with one line changed in CudaTransfer::compute_waits_for: `cuda_fence.event.block(compute stream)`
# instead of `wait_timer_.wait(...)` (untimed waits). Call 6 ran 324f5d7 plus
# benchmarks/results/session14_call6_copy_pool.patch (build/), against 324f5d7 itself (.gpu/head).
OUT=${1:?}

# ---- .gpu/s14call1.sh
# Session 14, call 1 (issue 13): the save hooks' leaves without grad decided by the engine (one op
# call more instead of the Python path) against the build before (de5faa8, .gpu/old) in alternating
# processes at 4k; modules' prefetch depth against a byte bound at 4k and 16k; host time per op call.
export PYTHONUNBUFFERED=1
ROOT=$PWD
new() { TORCH_OFFLOAD_LIBRARY=$ROOT/build/libtorch_offload.so PYTHONPATH=$ROOT "$@"; }
old() { (cd .gpu/old && TORCH_OFFLOAD_LIBRARY=$PWD/libtorch_offload.so PYTHONPATH=$PWD "$@"); }
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
lscpu | grep -iE "numa node|model name|^CPU\(s\)"
for i in 1 2 3; do
  old timeout 70 python3 benchmarks/bench_modules.py --out $OUT/old$i --seqs 4096 --steps 5 --rounds 3 2>&1 | grep -E "^\| 4096" | head -2 | sed "s/^/old$i /"
  new timeout 70 python3 benchmarks/bench_modules.py --out $OUT/new$i --seqs 4096 --steps 5 --rounds 3 2>&1 | grep -E "^\| 4096" | head -2 | sed "s/^/new$i /"
done 2>&1 | tee $OUT/leaf_ab_4k_h100.log
new timeout 60 python3 benchmarks/results/modules_pack_cost_4k.py 4096 10 2>&1 | grep -v -i warn | tee $OUT/modules_pack_cost_4k_leaf_h100.log
new timeout 280 python3 benchmarks/bench_modules.py --out $OUT/pf --seqs 4096,16384 --steps 5 --rounds 4 --prefetch-depths 8,16,32:256,32:512 2>&1 | grep -E "^\| (4096|16384)"

# ---- .gpu/s14call2.sh
# Session 14, call 2: host time per save-hook op call at 4k with leaves without grad decided by the
# engine (issue 13); hidden_states against checkpointing with the round order alternating, with the
# default allocator and with expandable segments, at 16k and 32k (issue 10).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 70 python3 benchmarks/results/modules_pack_cost_4k.py 4096 10 2>&1 | grep -v -i warn | tee $OUT/modules_pack_cost_4k_leaf_h100.log | tail -40
timeout 150 python3 benchmarks/results/hidden_order_16k.py 16384 4 2>&1 | grep -v -i warn | tee $OUT/hidden_order_16k_h100.log
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 150 python3 benchmarks/results/hidden_order_16k.py 16384 4 2>&1 | grep -v -i warn | tee $OUT/hidden_order_16k_expandable_h100.log
timeout 170 python3 benchmarks/results/hidden_order_16k.py 32768 2 2>&1 | grep -v -i warn | tee $OUT/hidden_order_32k_h100.log

# ---- .gpu/s14call3.sh
# Session 14, call 3 (issue 13), build fb80642: the 4k modules step step by step after the mode is
# applied (does it settle only after several steps?); modules *.self_attn at 4k and 16k, 5 rounds
# with bench_modules' default 2 warm-up steps, and at 4k with 10 warm-up steps.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/results/modules_warmup_4k.py 4096 2 20 2>&1 | grep -v -i warn | tee $OUT/modules_warmup_4k_h100.log
timeout 220 python3 benchmarks/bench_modules.py --out $OUT/m --seqs 4096,16384 --steps 5 --rounds 5 2>&1 | grep -E "^\| (4096|16384)"
timeout 150 python3 benchmarks/bench_modules.py --out $OUT/w --seqs 4096 --steps 5 --rounds 5 --warmup 10 2>&1 | grep -E "^\| 4096"
cp $OUT/m/modules_h100.md $OUT/modules_final_session14_h100.md; cp $OUT/m/modules_h100.json $OUT/modules_final_session14_h100.json
cp $OUT/w/modules_h100.md $OUT/modules_warmup10_4k_h100.md; cp $OUT/w/modules_h100.json $OUT/modules_warmup10_4k_h100.json
rm -rf $OUT/m $OUT/w

# ---- .gpu/s14call4.sh
# Session 14, call 4 (issue 13), build 324f5d7: the compute stream's timed waits (two timing events
# around each restore's wait) against the same build with untimed waits (.gpu/notime, diagnostic),
# modules *.self_attn at 4k in alternating processes; one 4k step's GPU timeline each; then the C++
# tests with CUDA and the save hooks' CUDA cases.
export PYTHONUNBUFFERED=1
ROOT=$PWD
timed() { TORCH_OFFLOAD_LIBRARY=$ROOT/build/libtorch_offload.so PYTHONPATH=$ROOT "$@"; }
untimed() { TORCH_OFFLOAD_LIBRARY=$ROOT/.gpu/notime/libtorch_offload.so PYTHONPATH=$ROOT "$@"; }
for i in 1 2 3; do
  untimed timeout 60 python3 benchmarks/bench_modules.py --out $OUT/u$i --seqs 4096 --steps 5 --rounds 3 --warmup 5 2>&1 | grep -E "^\| 4096" | head -2 | sed "s/^/untimed$i /"
  timed timeout 60 python3 benchmarks/bench_modules.py --out $OUT/t$i --seqs 4096 --steps 5 --rounds 3 --warmup 5 2>&1 | grep -E "^\| 4096" | head -2 | sed "s/^/timed$i /"
done 2>&1 | tee $OUT/wait_timing_ab_4k_h100.log
rm -rf $OUT/u? $OUT/t?
untimed timeout 60 python3 benchmarks/results/step_trace.py $OUT/tr_untimed 4096 modules 2>&1 | grep -v -i warn | tee $OUT/wait_timing_trace_untimed_4k_h100.log | head -c 1500; echo
timed timeout 60 python3 benchmarks/results/step_trace.py $OUT/tr_timed 4096 modules 2>&1 | grep -v -i warn | tee $OUT/wait_timing_trace_timed_4k_h100.log | head -c 1500; echo
rm -rf $OUT/tr_untimed $OUT/tr_timed
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$ROOT/build:$LD_LIBRARY_PATH
timeout 150 .gpu/bin/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100_session14.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest_h100_session14.log
(cd python_tests && timed timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_save_filter.py test_activations_dedup.py test_activations.py test_modules.py test_module_presets.py test_keep_on_device.py test_layers.py 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session14.log | tail -3)

# ---- .gpu/s14call5.sh
# Session 14, call 5: the final build (324f5d7): modules *.self_attn at 4k and 16k in 7 rounds with
# 5 warm-up steps per variant (steady state; each round applies the mode afresh); bf16 gradients of
# all and modules against the noise floor at 4k (issue 13).
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/bench_modules.py --out $OUT/mod --seqs 4096,16384 --steps 5 --rounds 7 --warmup 5 2>&1 | grep -E "^\| (4096|16384)" | head -6
timeout 200 python3 benchmarks/bench_activations.py --out $OUT/noise --seqs 4096 --variants none,all,modules --steps 3 --warmup 1 --soak-steps 2 2>&1 | grep -E "^\| 4096|noise|floor" | head -10
cp $OUT/mod/modules_h100.md $OUT/modules_final_session14_warmup5_h100.md; cp $OUT/mod/modules_h100.json $OUT/modules_final_session14_warmup5_h100.json
for f in $OUT/noise/*; do cp $f $OUT/noise_final_session14_4k_$(basename $f | sed 's/^activations_//'); done
rm -rf $OUT/mod $OUT/noise

# ---- .gpu/s14call6.sh
# Session 14, call 6: restored tensors allocated from the copy stream's pool (the copy starts when
# issued; the compute stream recorded as the block's user), against 324f5d7 (.gpu/head) where they
# came from the compute stream's pool and each copy first waited for the compute stream to reach
# its issue point. Per step compute wait at 4k; modules at 4k and 16k in alternating processes;
# hidden_states against checkpointing at 16k per build; then the C++ tests with CUDA and the CUDA
# cases of the save-hook and checkpoint files (issues 13, 10).
export PYTHONUNBUFFERED=1
ROOT=$PWD
side() { TORCH_OFFLOAD_LIBRARY=$ROOT/build/libtorch_offload.so PYTHONPATH=$ROOT "$@"; }
head_() { TORCH_OFFLOAD_LIBRARY=$ROOT/.gpu/head/libtorch_offload.so PYTHONPATH=$ROOT "$@"; }
for b in head_ side; do
  $b timeout 60 python3 benchmarks/results/modules_warmup_4k.py 4096 1 12 2>&1 | grep -v -i warn | sed "s/^/$b /"
done 2>&1 | tee $OUT/copy_pool_warmup_4k_h100.log | cut -c1-400
for i in 1 2; do
  for b in head_ side; do
    $b timeout 100 python3 benchmarks/bench_modules.py --out $OUT/m_$b$i --seqs 4096,16384 --steps 5 --rounds 3 --warmup 5 2>&1 | grep -E "^\| (4096|16384)" | sed "s/^/$b$i /"
    python3 -c "import json,sys; r=json.load(open('$OUT/m_$b$i/modules_h100.json')); print('$b$i reserved', [(x['seq'], x['variant'][:7], round(x['peak_reserved_GB'],2), round((x.get('stats') or {}).get('compute_wait_ms',0),1)) for x in r['runs']])"
  done
done 2>&1 | tee $OUT/copy_pool_ab_h100.log
rm -rf $OUT/m_*
for b in head_ side; do
  $b timeout 80 python3 benchmarks/bench_selective.py --out $OUT/s_$b --seqs 16384 --rounds 3 --steps 3 --warmup 1 --variants ckpt,hidden 2>&1 | grep -E "^\| 16384" | sed "s/^/$b /"
done 2>&1 | tee $OUT/copy_pool_hidden_16k_h100.log
rm -rf $OUT/s_*
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$ROOT/build:$LD_LIBRARY_PATH
timeout 150 .gpu/bin/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100_session14_copy_pool.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest_h100_session14_copy_pool.log
(cd python_tests && side timeout 240 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_save_filter.py test_activations_dedup.py test_activations.py test_modules.py test_keep_on_device.py test_layers.py test_checkpoint.py test_ops.py test_peak_memory_bound.py 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session14_copy_pool.log | tail -3)

# ---- .gpu/s14call7.sh
# Session 14, call 7 (issue 13): the final build (324f5d7's library; the commits since change results
# only): modules *.self_attn at 4k in 5 separate processes, 3 rounds of 5 steps after 5 warm-up steps
# each, for the spread between processes.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for i in 1 2 3 4 5; do
  timeout 80 python3 benchmarks/bench_modules.py --out $OUT/p$i --seqs 4096 --steps 5 --rounds 3 --warmup 5 2>&1 | grep -E "^\| 4096" | sed "s/^/process$i /"
  python3 -c "import json; r=json.load(open('$OUT/p$i/modules_h100.json')); rr=r['round_runs']; print('process$i rounds', [round(m['step_s']/n['step_s'],3) for n,m in zip(rr[0::2], rr[1::2])])"
done 2>&1 | tee $OUT/modules_processes_4k_h100.log
rm -rf $OUT/p?

# ---- .gpu/s14call8.sh
# Session 14, call 8, after the review: the compute-wait timer reads back its oldest pairs only on
# the hot path; the save filter's two kept branches merged. C++ tests with CUDA, the save-hook
# files' CUDA cases, and the 4k modules step's compute wait per step.
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
(export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$ROOT/build:$LD_LIBRARY_PATH
 timeout 150 .gpu/bin/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100_session14_review.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest_h100_session14_review.log)
(cd python_tests && timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_save_filter.py test_activations_dedup.py test_activations.py test_modules.py test_keep_on_device.py 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session14_review.log | tail -3)
timeout 60 python3 benchmarks/results/modules_warmup_4k.py 4096 1 12 2>&1 | grep -v -i warn | tee $OUT/modules_warmup_4k_review_h100.log | cut -c1-600
