#!/usr/bin/env bash
# Session 11's GPU calls (nvidia-h100-x1). Each call ran from the repository root with build/libtorch_offload.so
# built, TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD, and $OUT the folder that came back.
# Figures: benchmarks/results/README.md, "Session 11".

# ---- call 1: .gpu/s11call1.sh
# Session 11, call 1: the MLP's up/gate products kept on the GPU in the last blocks (keep_fc1), beside
# auto's session-7 plan, on the Llama-3-8B shape at 8k and the reference model at 16k.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 benchmarks/bench_selective.py --out $OUT/b8 --shape llama3_8b --seqs 8192 --steps 3 --warmup 1 \
  --variants "ckpt,sel:attention+qkv+out_proj@0.61#6/grads_in_forward,sel:attention+qkv+out_proj%16/grads_in_forward,sel:attention+qkv+out_proj%24/grads_in_forward,sel:attention+qkv+out_proj%30/grads_in_forward,sel:attention+qkv+out_proj%22#3/grads_in_forward" 2>&1 | tail -25
timeout 200 python3 benchmarks/bench_selective.py --out $OUT/r16 --seqs 16384 --steps 3 --warmup 1 \
  --variants "ckpt,sel:attention+qkv+out_proj@0.67#3/grads_in_forward,sel:attention+qkv+out_proj%8/grads_in_forward,sel:attention+qkv+out_proj%12/grads_in_forward,sel:attention+qkv+out_proj%16/grads_in_forward,sel:attention+qkv+out_proj%10#2/grads_in_forward" 2>&1 | tail -25

# ---- call 2: .gpu/s11call2.sh
# Session 11, call 2: mode="auto" with its kept up/gate trials (auto_kept.py) on the Llama-3-8B shape
# at 8k and the reference model at 16k; the CUDA tests of the kept products and auto.
timeout 330 python3 benchmarks/bench_selective.py --out $OUT/b8 --shape llama3_8b --seqs 8192 --rounds 2 --steps 3 --warmup 1 \
  --variants ckpt,auto/grads_in_forward 2>&1 | grep -v "^{'variant'" | tail -30
timeout 120 python3 benchmarks/bench_selective.py --out $OUT/r16 --seqs 16384 --steps 3 --warmup 1 \
  --variants ckpt,auto/grads_in_forward --auto-budget-gb ckpt 2>&1 | grep -v "^{'variant'" | tail -20
cd python_tests && timeout 100 python3 -m pytest -q -rf --tb=short -p no:cacheprovider test_auto_kept.py test_selective_keep.py test_auto_tail.py test_auto.py 2>&1 | tee $OUT/gpu_pytest.log | tail -8

# ---- call 3: .gpu/s11call3.sh
# Session 11, call 3: mode="auto" with kept up/gate trials on the Llama-3-8B shape at 8k, 3 rounds
# (auto plans anew in each); the CUDA cases of test_auto after its trial count was raised.
timeout 420 python3 benchmarks/bench_selective.py --out $OUT/b8 --shape llama3_8b --seqs 8192 --rounds 3 --steps 5 --warmup 1 \
  --variants ckpt,auto/grads_in_forward 2>&1 | grep -v "^{'variant'" | tail -30
cd python_tests && timeout 100 python3 -m pytest -q -rf --tb=short -p no:cacheprovider test_auto.py test_auto_kept.py 2>&1 | tee $OUT/gpu_pytest.log | tail -5

# ---- call 4: .gpu/s11call4.sh
# Session 11, call 4: compiled selective with the attention projections' products offloaded too
# (policy "attention+qkv+out_proj", compile_policies.py), with sdpa_is_causal, at 16k and 64k.
timeout 300 python3 benchmarks/bench_compile.py --out $OUT/c16 --seqs 16384 --steps 2 \
  --variants ckpt_compiled_causal,ours_selective_causal,ours_selective_proj_causal 2>&1 | tee $OUT/c16.log | grep -v "^{'variant'" | tail -16
timeout 250 python3 benchmarks/bench_compile.py --out $OUT/c64 --seqs 65536 --steps 1 \
  --variants ckpt_compiled_causal,ours_selective_proj_causal 2>&1 | tee $OUT/c64.log | grep -v "^{'variant'" | tail -14

# ---- call 5: .gpu/s11call5.sh
# Session 11, call 5 (issue 8): sdpa_is_causal's bf16 gradients against eager checkpointing's noise
# floor at 4k; where compiled checkpointing's 16k peak is without the dense mask, and how much of the
# boundary offloading can free there (peak_memory.py boundary_bound).
timeout 290 python3 benchmarks/bench_compile.py --out $OUT/noise --seqs "" --noise-seq 4096 \
  --variants ckpt_compiled_causal,ours_compiled_causal,ours_selective_causal 2>&1 | tee $OUT/noise.log | grep -v "^{'variant'" | tail -14
timeout 260 python3 benchmarks/peak_memory.py --out $OUT/peak --layers 24 --seqs 16384 \
  --variants ckpt_compiled_causal,ours_compiled_causal 2>&1 | tee $OUT/peak.log | tail -40

# ---- call 6: .gpu/s11call6.sh
# Session 11, call 6 (issue 8): the logits' zero gradient (1.05 GB at 16k) gone with detach_logits,
# on compiled checkpointing and on ours, at 16k and 32k, with sdpa_is_causal.
timeout 270 python3 benchmarks/bench_compile.py --out $OUT/c16 --seqs 16384 --steps 2 \
  --variants ckpt_compiled_causal,ckpt_compiled_causal_detach,ours_compiled_causal_detach 2>&1 | tee $OUT/c16.log | grep -v "^{'variant'" | tail -14
timeout 280 python3 benchmarks/bench_compile.py --out $OUT/c32 --seqs 32768 --steps 1 \
  --variants ckpt_compiled_causal,ckpt_compiled_causal_detach,ours_compiled_causal_detach 2>&1 | tee $OUT/c32.log | grep -v "^{'variant'" | tail -14

# ---- call 7: .gpu/s11call7.sh
# Session 11, call 7: auto with the kept up/gate trials on the reference model at 16k under
# checkpointing's budget, 2 rounds (issue 10); detach_logits at 64k (issue 8).
timeout 200 python3 benchmarks/bench_selective.py --out $OUT/r16 --seqs 16384 --rounds 2 --steps 5 --warmup 1 \
  --variants ckpt,auto/grads_in_forward --auto-budget-gb ckpt 2>&1 | grep -v "^{'variant'" | tail -20
timeout 320 python3 benchmarks/bench_compile.py --out $OUT/c64 --seqs 65536 --steps 1 \
  --variants ckpt_compiled_causal_detach,ours_compiled_causal_detach,ours_selective_proj_causal_detach 2>&1 | tee $OUT/c64.log | grep -v "^{'variant'" | tail -14

# ---- call 8
python3 benchmarks/bench_compile.py --out $OUT/noise --seqs "" --noise-seq 4096 --variants ckpt_compiled,ckpt_compiled_causal

# ---- call 9: .gpu/s11call9.sh
# Session 11, call 9 (issue 10): selective "attention" at 16k with a window of its newest saves kept
# on the GPU (its peak may exceed hidden_states' by 0.5 GB), beside hidden_states, 3 interleaved rounds.
timeout 280 python3 benchmarks/bench_selective.py --out $OUT/r16 --seqs 16384 --rounds 3 --steps 3 --warmup 1 \
  --variants ckpt,hidden,selective,selective@0.3,selective@0.5 2>&1 | grep -v "^{'variant'" | tail -16

# ---- call 10: .gpu/s11call10.sh
# Session 11, call 10: after be9d49c (a kept product held as an alias without autograd history):
# the CUDA cases of the kept products and auto, and auto on the Llama-3-8B shape at 8k once more.
(cd python_tests && timeout 100 python3 -m pytest -q -rf --tb=short -p no:cacheprovider test_selective_keep.py test_auto_kept.py test_auto.py 2>&1 | tee $OUT/gpu_pytest.log | tail -4)
timeout 200 python3 benchmarks/bench_selective.py --out $OUT/b8 --shape llama3_8b --seqs 8192 --steps 5 --warmup 1 \
  --variants ckpt,auto/grads_in_forward 2>&1 | grep -v "^{'variant'" | tail -12
