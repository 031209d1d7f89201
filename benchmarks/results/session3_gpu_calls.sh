# ---- .gpu/call1.sh (run as: bash .gpu/call1.sh, OUT set by the device tool; library and C++ test binary built locally and carried) ----
# Session 3, GPU call 1 (H100): C++ tests, compute-sanitizer on the CUDA concurrency tests, CUDA pytest,
# bench CLI with traces, modules bench.
set +e
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONUNBUFFERED=1
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL:$PWD/build:$LD_LIBRARY_PATH
nvidia-smi -L; date +%s > /tmp/t0
el() { echo "== $1 rc=$2 at $(( $(date +%s) - $(cat /tmp/t0) ))s"; }
timeout 150 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100.log 2>&1; el gtest $?
tail -3 $OUT/gtest_h100.log
F='CudaTransfer*:Tiers/CudaConcurrency*'
timeout 100 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 build/tests/torch_offload_tests --gtest_filter="$F" > $OUT/sanitizer_memcheck_h100.log 2>&1; el memcheck $?
tail -4 $OUT/sanitizer_memcheck_h100.log
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 build/tests/torch_offload_tests --gtest_filter="$F" > $OUT/sanitizer_racecheck_h100.log 2>&1; el racecheck $?
tail -4 $OUT/sanitizer_racecheck_h100.log
timeout 170 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda python_tests > $OUT/pytest_cuda_h100.log 2>&1; el pytest $?
tail -8 $OUT/pytest_cuda_h100.log
timeout 120 python3 -m torch_offload.bench --modes checkpointing,hidden_states --seqs 16384,32768 --steps 3 --warmup 1 --json $OUT/bench_cli_h100.json --trace /tmp/traces --no-progress > $OUT/bench_cli_h100.log 2>&1; el bench_cli $?
tail -8 $OUT/bench_cli_h100.log
(cd /tmp && tar czf $OUT/bench_cli_traces_h100.tar.gz traces); ls -la $OUT
timeout 100 python3 benchmarks/bench_modules.py --out /tmp/mod --steps 3 > /tmp/mod.log 2>&1; el modules $?
tail -12 /tmp/mod.log; cp /tmp/mod/*.json $OUT/ 2>/dev/null

# ---- .gpu/call2.sh (run as: bash .gpu/call2.sh, OUT set by the device tool; library and C++ test binary built locally and carried) ----
# Session 3, GPU call 2 (H100): sanitizers (no caching allocator, so leaks are ours), disk bandwidth,
# bench CLI with hidden_states through the disk tier.
set +e
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONUNBUFFERED=1
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL:$PWD/build:$LD_LIBRARY_PATH
date +%s > /tmp/t0; el() { echo "== $1 rc=$2 at $(( $(date +%s) - $(cat /tmp/t0) ))s"; }
F='CudaTransfer*:Tiers/CudaConcurrency*'
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 build/tests/torch_offload_tests --gtest_filter="$F" > $OUT/sanitizer_memcheck_h100.log 2>&1; el memcheck $?
tail -3 $OUT/sanitizer_memcheck_h100.log
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 build/tests/torch_offload_tests --gtest_filter="$F:-*NonDefaultComputeStream:*OneHandle*/Host" > $OUT/sanitizer_racecheck_h100.log 2>&1; el racecheck $?
tail -3 $OUT/sanitizer_racecheck_h100.log
timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 build/tests/torch_offload_tests --gtest_filter="$F:-*NonDefaultComputeStream:*OneHandle*/Host" > $OUT/sanitizer_synccheck_h100.log 2>&1; el synccheck $?
tail -2 $OUT/sanitizer_synccheck_h100.log
{ df -T /tmp; free -g; nproc
  dd if=/dev/zero of=/tmp/ddtest bs=16M count=256 oflag=direct 2>&1 | tail -1
  dd if=/tmp/ddtest of=/dev/null bs=16M iflag=direct 2>&1 | tail -1
  dd if=/dev/zero of=/tmp/ddtest2 bs=16M count=256 conv=fdatasync 2>&1 | tail -1; rm -f /tmp/ddtest /tmp/ddtest2; } > $OUT/disk_h100.log 2>&1; el dd $?
cat $OUT/disk_h100.log
timeout 330 python3 -m torch_offload.bench --modes checkpointing,hidden_states,hidden_states_disk --seqs 16384,32768,65536 --steps 3 --warmup 1 --disk-dir /tmp --json $OUT/bench_cli_disk_h100.json --no-progress > $OUT/bench_cli_disk_h100.log 2>&1; el bench_disk $?
tail -12 $OUT/bench_cli_disk_h100.log

# ---- .gpu/call3.sh (run as: bash .gpu/call3.sh, OUT set by the device tool; library and C++ test binary built locally and carried) ----
# Session 3, GPU call 3 (H100): issue 8 at 32k (compiled ckpt, ours selective, torch's own offload) and
# compiled `all` at 16k.
set +e
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONUNBUFFERED=1
date +%s > /tmp/t0; el() { echo "== $1 rc=$2 at $(( $(date +%s) - $(cat /tmp/t0) ))s"; }
timeout 330 python3 benchmarks/bench_compile.py --out /tmp/c32 --seqs 32768 --variants ckpt_compiled,ours_selective,torch_ao --steps 2 > $OUT/compile32.log 2>&1; el c32 $?
cp /tmp/c32/*.json $OUT/compile_h100_32k.json; cp /tmp/c32/*.md $OUT/compile_h100_32k.md; tail -8 $OUT/compile32.log
timeout 240 python3 benchmarks/bench_compile.py --out /tmp/call --seqs 16384 --variants ckpt_compiled,ours_all --steps 3 > $OUT/compile_all.log 2>&1; el call $?
cp /tmp/call/*.json $OUT/compile_h100_all16k.json; cp /tmp/call/*.md $OUT/compile_h100_all16k.md; tail -8 $OUT/compile_all.log

# ---- .gpu/call4.sh (run as: bash .gpu/call4.sh, OUT set by the device tool; library and C++ test binary built locally and carried) ----
# Session 3, GPU call 4 (H100): racecheck (rounds scaled to 10%), C++ tests, hidden_states through the
# disk tier after the read-ahead/IO-thread change, compiled selective at 64k.
set +e
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONUNBUFFERED=1
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL:$PWD/build:$LD_LIBRARY_PATH
date +%s > /tmp/t0; el() { echo "== $1 rc=$2 at $(( $(date +%s) - $(cat /tmp/t0) ))s"; }
timeout 60 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100.log 2>&1; el gtest $?; tail -2 $OUT/gtest_h100.log
TORCH_OFFLOAD_TEST_ROUNDS_PERCENT=10 timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 build/tests/torch_offload_tests --gtest_filter='CudaTransfer*:Tiers/CudaConcurrency*' > $OUT/sanitizer_racecheck_h100.log 2>&1; el racecheck $?
tail -3 $OUT/sanitizer_racecheck_h100.log
timeout 200 python3 -m torch_offload.bench --modes checkpointing,hidden_states_disk --seqs 16384,32768,65536 --steps 3 --warmup 1 --disk-dir /tmp --json $OUT/bench_cli_disk_h100.json --no-progress > $OUT/bench_cli_disk_h100.log 2>&1; el bench_disk $?
tail -8 $OUT/bench_cli_disk_h100.log
timeout 290 python3 benchmarks/bench_compile.py --out /tmp/c64 --seqs 65536 --variants ckpt_compiled,ours_selective --steps 1 > $OUT/compile64.log 2>&1; el c64 $?
cp /tmp/c64/*.json $OUT/compile_h100_64k_selective.json; cp /tmp/c64/*.md $OUT/compile_h100_64k_selective.md; tail -8 $OUT/compile64.log

# ---- .gpu/call5.sh (run as: bash .gpu/call5.sh, OUT set by the device tool; library and C++ test binary built locally and carried) ----
# Session 3, GPU call 5 (H100): hidden_states through the disk tier after keeping the newest file in
# memory; memcheck; the CUDA pytest cases after the deepcopy merge.
set +e
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONUNBUFFERED=1
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL:$PWD/build:$LD_LIBRARY_PATH
date +%s > /tmp/t0; el() { echo "== $1 rc=$2 at $(( $(date +%s) - $(cat /tmp/t0) ))s"; }
timeout 200 python3 -m torch_offload.bench --modes checkpointing,hidden_states_disk --seqs 16384,32768,65536 --steps 3 --warmup 1 --disk-dir /tmp --json $OUT/bench_cli_disk_h100.json --no-progress > $OUT/bench_cli_disk_h100.log 2>&1; el bench_disk $?
tail -8 $OUT/bench_cli_disk_h100.log
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool memcheck --leak-check full build/tests/torch_offload_tests --gtest_filter='CudaTransfer*:Tiers/CudaConcurrency*' > $OUT/sanitizer_memcheck_h100.log 2>&1; el memcheck $?
grep -E "PASSED|FAILED|ERROR SUMMARY|LEAK SUMMARY" $OUT/sanitizer_memcheck_h100.log
timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda python_tests > $OUT/pytest_cuda_h100.log 2>&1; el pytest $?
tail -4 $OUT/pytest_cuda_h100.log

# ---- .gpu/call6.sh (run as: bash .gpu/call6.sh, OUT set by the device tool; library and C++ test binary built locally and carried) ----
# Session 3, GPU call 6 (H100): C++ tests (CUDA concurrency on the disk tier), hidden_states through the
# disk tier after device prefetch of read-ahead files.
set +e
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONUNBUFFERED=1
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL:$PWD/build:$LD_LIBRARY_PATH
date +%s > /tmp/t0; el() { echo "== $1 rc=$2 at $(( $(date +%s) - $(cat /tmp/t0) ))s"; }
timeout 60 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100.log 2>&1; el gtest $?; tail -2 $OUT/gtest_h100.log
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool memcheck --leak-check full build/tests/torch_offload_tests --gtest_filter='CudaTransfer*:Tiers/CudaConcurrency*' > $OUT/sanitizer_memcheck_h100.log 2>&1; el memcheck $?
grep -E "PASSED|FAILED|ERROR SUMMARY|LEAK SUMMARY" $OUT/sanitizer_memcheck_h100.log
timeout 200 python3 -m torch_offload.bench --modes checkpointing,hidden_states,hidden_states_disk --seqs 16384,32768,65536 --steps 3 --warmup 1 --disk-dir /tmp --json $OUT/bench_cli_disk_h100.json --png $OUT/bench_cli_disk_h100.png --no-progress > $OUT/bench_cli_disk_h100.log 2>&1; el bench_disk $?
tail -12 $OUT/bench_cli_disk_h100.log

# ---- .gpu/call7.sh ----
# Session 3, GPU call 7 (H100): merged main (deepcopy, presets, unity build, nested check): C++ tests,
# every CUDA pytest case, modules presets benchmark.
set +e
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONUNBUFFERED=1
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL:$PWD/build:$LD_LIBRARY_PATH
date +%s > /tmp/t0; el() { echo "== $1 rc=$2 at $(( $(date +%s) - $(cat /tmp/t0) ))s"; }
timeout 60 build/tests/torch_offload_tests --gtest_brief=1 > $OUT/gtest_h100.log 2>&1; el gtest $?; tail -2 $OUT/gtest_h100.log
timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda python_tests > $OUT/pytest_cuda_h100.log 2>&1; el pytest $?
tail -4 $OUT/pytest_cuda_h100.log
timeout 200 python3 benchmarks/bench_modules.py --out /tmp/mod --steps 3 --targets '*.self_attn' --targets preset:qkv --targets preset:core_attn --targets preset:mlp > $OUT/modules_presets.log 2>&1; el modules $?
cp /tmp/mod/modules_h100.json $OUT/modules_presets_h100.json; cp /tmp/mod/modules_h100.md $OUT/modules_presets_h100.md; tail -14 $OUT/modules_presets.log
# ---- .gpu/call8.sh ----
# Session 3, GPU call 8 (H100): hidden_states through the disk tier at 64k with 6 measured steps.
set +e
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONUNBUFFERED=1
timeout 280 python3 -m torch_offload.bench --modes checkpointing,hidden_states,hidden_states_disk --seqs 65536 --steps 6 --warmup 1 --disk-dir /tmp --json $OUT/bench_cli_disk_h100_64k_6steps.json --no-progress 2>&1 | tee $OUT/bench_cli_disk_h100_64k_6steps.log | tail -6
# ---- .gpu/call9.sh ----
# Session 3, GPU call 9 (H100): the bench CLI's link utilisation per direction at 16k.
set +e
export TORCH_OFFLOAD_LIBRARY=$PWD/build/libtorch_offload.so PYTHONUNBUFFERED=1
timeout 240 python3 -m torch_offload.bench --modes checkpointing,hidden_states,hidden_states_disk,all --seqs 16384 --steps 3 --warmup 1 --disk-dir /tmp --json $OUT/bench_cli_link_h100.json --no-progress 2>&1 | tee $OUT/bench_cli_link_h100.log | tail -7
