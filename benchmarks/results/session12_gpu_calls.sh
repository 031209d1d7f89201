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

# ---- call 3: .gpu/s12call3.sh (carry .whl for TRL)
# Session 12, call 3 (issue 13): the save hooks' deduplicated saves in C++ (offload_pack /
# offload_unpack): CUDA cases, modules `*.self_attn` at 4k / 16k, `all` at 16k beside TRL, bf16 noise.
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
(cd python_tests && timeout 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_activations_dedup.py test_activations.py test_modules.py test_module_presets.py test_keep_on_device.py 2>&1 | tee $OUT/gpu_pytest.log | tail -4)
timeout 200 python3 benchmarks/bench_modules.py --out $OUT/mod --seqs 4096,16384 --steps 5 --rounds 3 2>&1 | grep -E "^\||ratio|freed" | head -12
timeout 170 python3 benchmarks/bench_activations.py --out $OUT/act --seqs 16384 --variants none,all,trl --no-noise --soak-steps 2 --warmup 1 --steps 3 2>&1 | grep -E "^\| 16384|TRL|distinct" | head -8
timeout 120 python3 benchmarks/bench_activations.py --out $OUT/noise --seqs 4096 --variants none,all,modules --steps 3 --warmup 1 --soak-steps 2 2>&1 | grep -E "^\||noise|floor" | head -12

# ---- call 4: .gpu/s12call4.sh
# Session 12, call 4 (issue 13): where the host time of a 4k modules step goes after the C++ save table.
timeout 200 python3 benchmarks/results/modules_host_profile_4k.py 4096 2>&1 | grep -v Warning | tee $OUT/modules_host_profile_4k_h100.log | head -120

# ---- call 5: .gpu/s12call5.sh (carry .whl for py-spy; the third version; the first, py-spy
# recording the whole run at 1000 Hz with native frames, fell 80 s behind and wrote nothing; the
# second, with --nonblocking, cannot take native frames)
python3 -m pip install -q --no-deps --no-index .whl/py_spy-*.whl 2>&1 | grep -v WARNING | tail -1
python3 benchmarks/results/modules_loop_4k.py 400 &
sleep 25
timeout 60 py-spy record --native --format raw --rate 50 -d 15 -o $OUT/modules_4k_pyspy.txt --pid $! 2>&1 | tail -3
wait

# ---- call 6: .gpu/s12call6.sh (carry build/tests/torch_offload_tests too), then the C++ tests again
# with torch's lib/ on LD_LIBRARY_PATH (the first run could not load libtorch.so)
(cd python_tests && timeout 330 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda . 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session12_final.log | tail -5)
timeout 120 python3 benchmarks/bench_modules.py --out $OUT/mod --seqs 4096,16384 --steps 5 --rounds 3 2>&1 | grep -E "^\| (4096|16384)" | head -6
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$LD_LIBRARY_PATH
timeout 150 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100_session12.log 2>&1; echo "gtest rc=$?"; tail -4 $OUT/gtest_h100_session12.log

# ---- call 7: .gpu/s12call7.sh
# Session 12, call 7: modules `*.self_attn` at 4k / 16k in 5 interleaved rounds on the final build
# (issue 13); auto with use_reentrant=True and the kept trials on the Llama-3-8B shape (issue 10).
timeout 170 python3 benchmarks/bench_modules.py --out $OUT/mod --seqs 4096,16384 --steps 5 --rounds 5 2>&1 | grep -E "^\| (4096|16384)" | head -6
timeout 390 python3 benchmarks/bench_selective.py --out $OUT/b8 --shape llama3_8b --seqs 8192 --steps 3 --warmup 1 \
  --variants ckpt,ckpt_re,auto_re/grads_in_forward 2>&1 | grep -v "^{'variant'" | tail -12

# ---- call 8: .gpu/s12call8.sh (carry build/tests/torch_offload_tests too)
# Session 12, call 8: after 4eebe6c (a dying save handle drops its copy's restore): the CUDA cases
# of the save-hook tests and the C++ tests with CUDA.
export LD_LIBRARY_PATH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):$LD_LIBRARY_PATH
timeout 150 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100_session12_final.log 2>&1; echo "gtest rc=$?"; tail -3 $OUT/gtest_h100_session12_final.log
(cd python_tests && timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda test_activations_dedup.py test_activations.py test_modules.py test_module_presets.py test_keep_on_device.py test_layers.py test_fsdp2.py 2>&1 | tee $OUT/gpu_pytest_cuda_h100_session12_call8.log | tail -3)
