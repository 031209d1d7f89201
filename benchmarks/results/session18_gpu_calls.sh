# Session 18 (2026-11-24): the GPU calls, in order; calls 1-5, 7 and 9-14 ran as `bash .gpu/s18callN.sh $OUT` on nvidia-h100-x1
# with carry [build/libtorch_offload.so, build/_save_hooks.cpython-312-x86_64-linux-gnu.so (built here against
# /root/.pyenv/versions/3.12.1: cmake -S . -B /tmp/build-py312 -G Ninja -DPython3_EXECUTABLE=/root/.pyenv/versions/3.12.1/bin/python3
# -DTORCH_OFFLOAD_BUILD_TESTS=OFF -DTORCH_OFFLOAD_BUILD_EXAMPLES=OFF, target torch_offload_save_hooks, strip --strip-debug), .gpu];
# call 6 built everything on the GPU machine itself. Call 1 ran b38d067 (the checkpoint frames); call 2 that plus
# the dispatch mode without torch's dynamo-disable wrapper (committed with the stand-in); calls 3-6 the stand-in
# (5957396) and this session's README (gpu_check's summary names the copy's git base, f3ae411, "+dirty").
# Call 13 ran twice (its first snapshot read no stack frames; the script was fixed); its second run is the log. Call 14 ran
# the tree with _Offloaded.finish_saves (committed after it).

### call 1
# Session 18, call 1: our non-reentrant checkpoint with its hooks in C (torch_offload/nonreentrant.py) against
# the same checkpoint through torch's implementation, step by step in one process, at 4k and 16k; the CUDA tests.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
(cd python_tests && timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider test_nonreentrant.py test_checkpoint.py \
  test_checkpoint_torch_suite.py test_checkpoint_torch_suite_sac.py test_reentrant.py test_selective.py test_models.py) \
  > $OUT/gpu_pytest_cuda_h100_session18_call1.log 2>&1; tail -3 $OUT/gpu_pytest_cuda_h100_session18_call1.log
timeout 150 python3 benchmarks/results/stepwise_models_issue10.py 4096 40 ckpt,hidden,hidden_torchhooks,selective,selective_torchhooks,ckpt_re,hidden_re,selective_re \
  > $OUT/stepwise_c_frames_4k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_c_frames_4k_h100.log | tail -9
timeout 130 python3 benchmarks/results/stepwise_models_issue10.py 16384 10 ckpt,hidden,hidden_torchhooks,selective,selective_torchhooks \
  > $OUT/stepwise_c_frames_16k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_c_frames_16k_h100.log | tail -6
timeout 140 python3 benchmarks/bench_selective.py --out $OUT/sel4k --seqs 4096 --rounds 5 --steps 5 --warmup 1 \
  --variants ckpt,ckpt_re,hidden,hidden_re,selective,selective_re > $OUT/bench_selective_4k_c_frames_h100.log 2>&1
tail -12 $OUT/bench_selective_4k_c_frames_h100.log

### call 2
# Session 18, call 2: where selective "attention" loses to hidden_states at 4k now that both run on the C checkpoint
# hooks: forward / backward host time and waits, with and without copies; one profiled step each; CUDA tests.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
(cd python_tests && timeout 120 python3 -m pytest -q -m cuda -p no:cacheprovider test_selective.py test_selective_keep.py \
  test_auto.py test_nonreentrant.py) > $OUT/gpu_pytest_cuda_h100_session18_call2.log 2>&1; tail -2 $OUT/gpu_pytest_cuda_h100_session18_call2.log
timeout 150 python3 benchmarks/results/selective_phases_4k.py 4096 4 ckpt,hidden_states,selective,selective_nocopy \
  > $OUT/selective_phases_4k_c_frames_h100.log 2>&1; grep -v -i warn $OUT/selective_phases_4k_c_frames_h100.log | tail -5
timeout 150 python3 benchmarks/profile_short_step.py --out $OUT/prof --seq 4096 --variants hidden_states,selective \
  > $OUT/profile_4k_selective_c_frames_h100.log 2>&1; grep -v -i warn $OUT/profile_4k_selective_c_frames_h100.log | head -120

### call 3
# Session 18, call 3: selective "attention" with the attention call stood in for in the recompute (stand_in.py)
# against the dispatch-mode path, step by step at 4k and 16k; bench_selective's rounds; CUDA tests.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
(cd python_tests && timeout 120 python3 -m pytest -q -m cuda -p no:cacheprovider test_stand_in.py test_selective.py \
  test_selective_keep.py test_nonreentrant.py test_auto.py test_models.py) > $OUT/gpu_pytest_cuda_h100_session18_call3.log 2>&1
tail -2 $OUT/gpu_pytest_cuda_h100_session18_call3.log
timeout 140 python3 benchmarks/results/stepwise_models_issue10.py 4096 40 ckpt,hidden,selective,selective_modepath,ckpt_re,hidden_re,selective_re \
  > $OUT/stepwise_stand_in_4k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_stand_in_4k_h100.log | tail -8
timeout 120 python3 benchmarks/results/stepwise_models_issue10.py 16384 10 ckpt,hidden,selective,selective_modepath \
  > $OUT/stepwise_stand_in_16k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_stand_in_16k_h100.log | tail -5
timeout 150 python3 benchmarks/bench_selective.py --out $OUT/sel --seqs 4096,16384 --rounds 3 --steps 5 --warmup 1 \
  --noise-seq 4096 --variants ckpt,hidden,selective > $OUT/bench_selective_stand_in_h100.log 2>&1
tail -14 $OUT/bench_selective_stand_in_h100.log

### call 4
# Session 18, call 4: selective "attention" at 4k with the stand-in (stand_in.py): forward / backward host time
# against hidden_states, with and without its copies; one profiled step each.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/results/selective_phases_4k.py 4096 4 ckpt,hidden_states,selective,selective_nocopy \
  > $OUT/selective_phases_4k_stand_in_h100.log 2>&1; grep -v -i warn $OUT/selective_phases_4k_stand_in_h100.log | tail -5
timeout 150 python3 benchmarks/profile_short_step.py --out $OUT/prof --seq 4096 --variants hidden_states,selective \
  > $OUT/profile_4k_stand_in_h100.log 2>&1; grep -E "===|kernel busy|runtime top|copies" $OUT/profile_4k_stand_in_h100.log

### call 5
# Session 18, call 5: the final build's figures for issue 10: what the stand-in captures; hidden_states and
# selective "attention" against torch's checkpoint step by step at 4k, 16k, 32k; bench_selective's rounds.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 60 python3 benchmarks/results/stand_in_saves.py 4096 > $OUT/stand_in_saves_4k_h100.log 2>&1
grep -v -i warn $OUT/stand_in_saves_4k_h100.log | tail -3
timeout 130 python3 benchmarks/results/stepwise_models_issue10.py 4096 60 ckpt,hidden,selective,ckpt_re,hidden_re,selective_re \
  > $OUT/stepwise_final_4k_session18_h100.log 2>&1; grep -v -i warn $OUT/stepwise_final_4k_session18_h100.log | tail -7
timeout 100 python3 benchmarks/results/stepwise_models_issue10.py 16384 12 ckpt,hidden,selective \
  > $OUT/stepwise_final_16k_session18_h100.log 2>&1; grep -v -i warn $OUT/stepwise_final_16k_session18_h100.log | tail -4
timeout 110 python3 benchmarks/results/stepwise_models_issue10.py 32768 6 ckpt,hidden \
  > $OUT/stepwise_final_32k_session18_h100.log 2>&1; grep -v -i warn $OUT/stepwise_final_32k_session18_h100.log | tail -3
timeout 170 python3 benchmarks/bench_selective.py --out $OUT/sel --seqs 4096,16384 --rounds 5 --steps 5 --warmup 1 \
  --variants ckpt,hidden,selective > $OUT/bench_selective_final_session18_h100.log 2>&1
grep -E "^\| [0-9]" $OUT/bench_selective_final_session18_h100.log

### call 6
SKIP_BENCH=1 bash benchmarks/gpu_check.sh $OUT > $OUT/gpu_check_session18.log 2>&1

### call 7
# Session 18, call 7: issue 10's auto target at 16k: which selective rows the final build gives, with the out_proj
# products kept on the GPU instead of offloaded (the link is full at 16k with attention+qkv+out_proj), and auto.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 280 python3 benchmarks/bench_selective.py --out $OUT/sel16 --seqs 16384 --rounds 3 --steps 3 --warmup 1 \
  --variants ckpt,selective,sel:attention+qkv+out_proj,sel:attention+qkv+keep_out_proj,auto > $OUT/bench_selective_16k_keep_out_proj_h100.log 2>&1
grep -E "^\| [0-9]|plan|kept" $OUT/bench_selective_16k_keep_out_proj_h100.log | head -30

### call 8
SKIP_BENCH=1 bash benchmarks/gpu_check.sh $OUT > $OUT/gpu_check_session18_final.log 2>&1  # the tree at 0b78cee

### call 9
# Session 18, call 9: hidden_states (and "attention") against torch's checkpoint at 16k and 32k, more sets, final build.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/stepwise_models_issue10.py 32768 14 ckpt,hidden \
  > $OUT/stepwise_final_32k_14sets_session18_h100.log 2>&1; grep -v -i warn $OUT/stepwise_final_32k_14sets_session18_h100.log | tail -3
timeout 200 python3 benchmarks/results/stepwise_models_issue10.py 16384 30 ckpt,hidden,selective \
  > $OUT/stepwise_final_16k_30sets_session18_h100.log 2>&1; grep -v -i warn $OUT/stepwise_final_16k_30sets_session18_h100.log | tail -4

### call 10
# Session 18, call 10: issue 10's 64k target with the final build (the C checkpoint hooks, the attention stand-in).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 420 python3 benchmarks/bench_selective.py --out $OUT/sel64 --seqs 65536 --steps 2 --warmup 1 \
  --variants ckpt,hidden,selective > $OUT/bench_selective_64k_session18_h100.log 2>&1
grep -E "^\| [0-9]" $OUT/bench_selective_64k_session18_h100.log

### call 11
# Session 18, call 11: selective's peak at 64k with the stand-in against the dispatch-mode path, one process.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/results/stepwise_models_issue10.py 65536 3 hidden,selective,selective_modepath \
  > $OUT/stepwise_stand_in_64k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_stand_in_64k_h100.log | tail -4

### call 12
# Session 18, call 12: where the stand-in's extra peak memory is, forward or backward (32k and 64k).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/results/stand_in_peak_phases.py 32768 2 > $OUT/stand_in_peak_phases_32k_h100.log 2>&1
grep -v -i warn $OUT/stand_in_peak_phases_32k_h100.log | tail -4

### call 13
# Session 18, call 13: what the stand-in holds after the forward that the dispatch-mode path does not (16k).
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/results/stand_in_after_forward.py 16384 > $OUT/stand_in_after_forward_16k_h100.log 2>&1
grep -v -i warn $OUT/stand_in_after_forward_16k_h100.log | tail -40

### call 14
# Session 18, call 14: the offloaded outputs' device memory released at the end of each selective block's forward
# (_Offloaded.finish_saves): peaks at 32k (forward / backward) and 64k, against hidden_states and the mode path.
OUT=${1:?}
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/results/stand_in_peak_phases.py 32768 2 > $OUT/stand_in_peak_phases_32k_finish_h100.log 2>&1
grep -v -i warn $OUT/stand_in_peak_phases_32k_finish_h100.log | tail -4
timeout 300 python3 benchmarks/results/stepwise_models_issue10.py 65536 3 ckpt,hidden,selective,selective_modepath \
  > $OUT/stepwise_finish_64k_h100.log 2>&1; grep -v -i warn $OUT/stepwise_finish_64k_h100.log | tail -5
