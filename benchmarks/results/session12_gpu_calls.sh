#!/usr/bin/env bash
# Session 12's GPU calls (nvidia-h100-x1), in order; each ran as `bash .gpu/s12callN.sh $OUT` with
# TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD.
OUT=${1:?}

# ---- call 1: .gpu/s12call1.sh
# Session 12, call 1 (issue 10): where hidden_states loses ~1.2% to torch's checkpoint at 16k.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv
timeout 420 python3 benchmarks/results/hidden_overhead_16k.py 16384 4 2>&1 | grep -v Warning | tee $OUT/hidden_overhead_16k_h100.log

# ---- call 2: .gpu/s12call2.sh
# Session 12, call 2 (issue 10): hidden_states with its last block left unchecked (#1) beside
# checkpointing at 16k and 32k, and torch's SAC keeping the attention outputs (the ceiling of the
# "attention" policy) beside selective, interleaved rounds.
timeout 240 python3 benchmarks/bench_selective.py --out $OUT/r16 --seqs 16384 --rounds 3 --steps 3 --warmup 1 \
  --variants ckpt,torch_sac,hidden,hidden#1,selective,selective@0.5,selective#1 2>&1 | grep -v "^{'variant'" | tail -14
timeout 200 python3 benchmarks/bench_selective.py --out $OUT/r32 --seqs 32768 --rounds 3 --steps 3 --warmup 1 \
  --variants ckpt,hidden,hidden#1 2>&1 | grep -v "^{'variant'" | tail -10
