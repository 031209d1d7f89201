#!/usr/bin/env bash
# The one script to run on a GPU machine: builds the library, the C save hooks and the C++ tests;
# runs ctest, pytest's CUDA cases, the demo (examples/demo.py) and the benchmarks, writing into
# OUTDIR (no sub-folders):
#   build.log ctest.log pytest.log bench.log (demo + benchmark output) summary.txt
#   hidden_states_<gpu>.json hidden_states_<gpu>.md (and the other benchmarks' files, see BENCHES)
# With more than PACK_OVER files (default 8) in OUTDIR at the end, all but summary.txt are packed
# into gpu_check.tar.gz (handy when OUTDIR is copied back from a remote machine; PACK_OVER=0: never).
#
#   bash benchmarks/gpu_check.sh OUTDIR
#   SKIP_BENCH=1 bash benchmarks/gpu_check.sh OUTDIR          build and tests only
#   BENCHES="hidden_states modules" bash benchmarks/gpu_check.sh OUTDIR
#
# Test failures do not stop the script: every phase runs, its exit code goes into summary.txt, and
# the script exits non-zero at the end if any phase failed. Only a failed library build stops it.
# Expected times on an H100: build ~2 min, ctest (4 in parallel) ~1 min, pytest's CUDA cases (the
# CPU ones run in CI) ~3 min, demo ~0.5 min, the hidden_states benchmark 3-3.5 min (16k ~0.5,
# 32k ~1, 64k ~1.5-2 min with 3 measured steps under the 30 s budget per run): 6.5-8 min in all.
# TOTAL_BUDGET_S (default 540 s) is a plan, not a limit: the hidden_states benchmark gets what is
# left and skips the runs that would not fit (listed as skipped); every phase is also bounded by
# `timeout`.
#
# Environment overrides:
#   BENCH_SEQS=16384,32768,65536   sequence lengths of the hidden_states benchmark
#   BENCH_SKIP=none@65536,...      variant@seq runs known not to fit (OOM)
#   BENCH_VARIANTS=none,ckpt,save_on_cpu,ours   (hf_offload is also available)
#   BENCH_VARIANT_BUDGET_S=30      per (variant, seq) run, warm-up included: fewer steps at long seqs
#   BENCH_ARGS="..."               extra arguments for bench_hidden_states.py (e.g. "--steps 10")
#   BENCHES="hidden_states"        benchmarks to run, from: hidden_states activations compile layers modules
#   ACT_ARGS="..."                 extra arguments for bench_{activations,compile,layers,modules}.py
#   BENCH_TIMEOUT_S=560            limit for each of those
#   TOTAL_BUDGET_S=540             the whole script's time target
#   SKIP_TESTS=1                   build the library only; no ctest, no pytest
#   SKIP_BENCH=1                   no benchmark
#   SKIP_DEMO=1                    no demo
#   PYTEST_ARGS="-q -x -m cuda"    arguments after `python3 -m pytest python_tests` ("-q -x": every case)
#   CTEST_PARALLEL=4               C++ test processes at once
#   CTEST_TIMEOUT_S=150 PYTEST_TIMEOUT_S=240 DEMO_TIMEOUT_S=120   phase limits (seconds)
#   PACK_OVER=8                    pack OUTDIR into gpu_check.tar.gz above this many files (0: never)
#   PYTHON=python3
#   GoogleTest sources in .gtest-src/ (if present) are built when GoogleTest is not installed.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
mkdir -p "$1"
OUTDIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

export PYTHONUNBUFFERED=1
export TORCH_OFFLOAD_LIBRARY="$REPO/build/libtorch_offload.so"  # the one built below
PY=${PYTHON:-python3}
TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-540}
BENCH_SEQS=${BENCH_SEQS:-16384,32768,65536}
BENCH_SKIP=${BENCH_SKIP:-none@65536,none@131072}
BENCH_VARIANTS=${BENCH_VARIANTS:-none,ckpt,save_on_cpu,ours}
BENCH_VARIANT_BUDGET_S=${BENCH_VARIANT_BUDGET_S:-30}
SKIP_TESTS=${SKIP_TESTS:-0}
SKIP_BENCH=${SKIP_BENCH:-0}
SKIP_DEMO=${SKIP_DEMO:-0}
PYTEST_ARGS=${PYTEST_ARGS:--q -x -m cuda}
CTEST_PARALLEL=${CTEST_PARALLEL:-4}
CTEST_TIMEOUT_S=${CTEST_TIMEOUT_S:-150}
PYTEST_TIMEOUT_S=${PYTEST_TIMEOUT_S:-240}
DEMO_TIMEOUT_S=${DEMO_TIMEOUT_S:-120}

SUMMARY="$OUTDIR/summary.txt"
BENCH_LOG="$OUTDIR/bench.log"
: >"$SUMMARY"
: >"$BENCH_LOG"
T0=$(date +%s)
FAILED=()
NOT_RUN=()  # phases that could not run on this machine (not failures, but not passes either)

now() { date +%s; }
say() { echo "[gpu_check +$(( $(now) - T0 ))s] $*"; }
phase_start() { PHASE=$1; PT0=$(now); say "== $PHASE"; }
# phase_end RC NOTE: one line per phase in summary.txt; a failed phase is remembered.
phase_end() {
  local rc=$1 note=${2:-}
  local line
  line=$(printf '%-7s %-9s %5ss  %s' "$PHASE" "$([ "$rc" = 0 ] && echo ok || echo "FAIL($rc)")" \
    "$(( $(now) - PT0 ))" "$note")
  echo "$line" >>"$SUMMARY"
  say "$line"
  if [ "$rc" != 0 ]; then FAILED+=("$PHASE"); fi
}
show_tail() {  # the end of a failed phase's log, so that it shows in the caller's output
  echo "---- last $2 lines of $(basename "$1") ----"
  tail -n "$2" "$1" || true
  echo "----"
}

{
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo "n/a (no git)")
  if git rev-parse --git-dir >/dev/null 2>&1 && ! git diff --quiet HEAD 2>/dev/null; then commit="$commit+dirty"; fi
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ)  repo $REPO  commit $commit"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: n/a"
  "$PY" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda, "| transformers", transformers.__version__, "| gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "NONE")' 2>&1 || true
  echo "cpus $(nproc); host memory $(free -g 2>/dev/null | awk '/Mem:/{print $2 " GiB"}')"
  echo "settings: BENCH_SEQS=$BENCH_SEQS BENCH_SKIP=$BENCH_SKIP BENCH_VARIANTS=$BENCH_VARIANTS BENCH_VARIANT_BUDGET_S=$BENCH_VARIANT_BUDGET_S BENCH_ARGS=${BENCH_ARGS:-} TOTAL_BUDGET_S=$TOTAL_BUDGET_S SKIP_TESTS=$SKIP_TESTS SKIP_BENCH=$SKIP_BENCH SKIP_DEMO=$SKIP_DEMO"
  echo
  echo "phase   result     time  note"
} >>"$SUMMARY"
cat "$SUMMARY"

# ---------------------------------------------------------------- build
phase_start build
BUILD_LOG="$OUTDIR/build.log"
TESTS_FLAG=ON
[ "$SKIP_TESTS" = 1 ] && TESTS_FLAG=OFF
PREFIX=$("$PY" -c 'import torch;print(torch.utils.cmake_prefix_path)')
GTEST_ARGS=()
# Without an installed GoogleTest, sources in .gtest-src are built instead.
[ -d .gtest-src ] && GTEST_ARGS=(-DTORCH_OFFLOAD_GTEST_SOURCE_DIR="$REPO/.gtest-src")
configure() {
  cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DTORCH_OFFLOAD_BUILD_TESTS="$1" \
    ${GTEST_ARGS[@]+"${GTEST_ARGS[@]}"}
}
rc=0
configure "$TESTS_FLAG" >"$BUILD_LOG" 2>&1 || rc=$?
note=""
if [ $rc != 0 ] && [ "$TESTS_FLAG" = ON ]; then
  # Most likely GoogleTest is missing on this machine: build the library without the C++ tests.
  echo "=== configure with tests failed (rc=$rc); retrying with -DTORCH_OFFLOAD_BUILD_TESTS=OFF" >>"$BUILD_LOG"
  TESTS_FLAG=OFF
  note="C++ tests NOT built (configure with them failed, see build.log); "
  rc=0
  configure OFF >>"$BUILD_LOG" 2>&1 || rc=$?
fi
if [ $rc = 0 ]; then
  # The library and, where this Python's headers are found, the C save hooks (pyext/save_hooks.cpp).
  cmake --build build -j --target torch_offload_python >>"$BUILD_LOG" 2>&1 || rc=$?
fi
if compgen -G "build/_save_hooks.*.so" >/dev/null; then
  note="${note}C save hooks built; "
else
  note="${note}C save hooks NOT built (no Python headers: the Python hooks run); "
fi
TEST_BUILD_RC=0
if [ $rc = 0 ] && [ "$TESTS_FLAG" = ON ]; then
  cmake --build build -j >>"$BUILD_LOG" 2>&1 || TEST_BUILD_RC=$?
  [ $TEST_BUILD_RC != 0 ] && note="${note}C++ tests failed to build (rc=$TEST_BUILD_RC); "
fi
phase_end $rc "${note}library: $(stat -c '%s bytes' build/libtorch_offload.so 2>/dev/null || echo missing)"
if [ $rc != 0 ] || [ ! -f build/libtorch_offload.so ]; then
  show_tail "$BUILD_LOG" 60
  say "library build failed: stopping"
  echo "RESULT: FAILED (build)" >>"$SUMMARY"
  exit 1
fi
if [ $TEST_BUILD_RC != 0 ]; then show_tail "$BUILD_LOG" 40; fi

# ---------------------------------------------------------------- ctest
if [ "$SKIP_TESTS" = 1 ]; then
  echo "ctest   skipped         SKIP_TESTS=1" >>"$SUMMARY"
elif [ "$TESTS_FLAG" = OFF ]; then
  echo "C++ tests not built: configuring with them failed (GoogleTest missing?), see build.log" \
    >"$OUTDIR/ctest.log"
  echo "ctest   NOT RUN         C++ tests not built (see build.log)" >>"$SUMMARY"
  NOT_RUN+=(ctest)
  say "ctest not run: C++ tests not built"
else
  phase_start ctest
  rc=$TEST_BUILD_RC
  if [ $rc = 0 ]; then
    timeout -k 10 "$CTEST_TIMEOUT_S" ctest --test-dir build --output-on-failure --timeout 120 -j "$CTEST_PARALLEL" \
      >"$OUTDIR/ctest.log" 2>&1 || rc=$?
  else
    echo "C++ tests failed to build (see build.log)" >"$OUTDIR/ctest.log"
  fi
  phase_end $rc "$(grep -E 'tests passed|tests failed' "$OUTDIR/ctest.log" | tail -n 1)"
  [ $rc != 0 ] && show_tail "$OUTDIR/ctest.log" 40
fi

# ---------------------------------------------------------------- pytest
if [ "$SKIP_TESTS" = 1 ]; then
  echo "pytest  skipped         SKIP_TESTS=1" >>"$SUMMARY"
else
  phase_start pytest
  rc=0
  # PYTEST_ARGS is a list of words: split it on purpose
  # shellcheck disable=SC2086
  timeout -k 10 "$PYTEST_TIMEOUT_S" "$PY" -m pytest python_tests $PYTEST_ARGS -p no:cacheprovider \
    >"$OUTDIR/pytest.log" 2>&1 || rc=$?
  [ $rc = 124 ] && echo "=== pytest stopped by timeout after ${PYTEST_TIMEOUT_S}s" >>"$OUTDIR/pytest.log"
  phase_end $rc "$(grep -E '(passed|failed|error|skipped|no tests ran)' "$OUTDIR/pytest.log" | tail -n 1)"
  [ $rc != 0 ] && show_tail "$OUTDIR/pytest.log" 40
fi

# ---------------------------------------------------------------- demo
if [ "$SKIP_DEMO" = 1 ]; then
  echo "demo    skipped         SKIP_DEMO=1" >>"$SUMMARY"
else
  phase_start demo
  rc=0
  echo "===== examples/demo.py" >>"$BENCH_LOG"
  timeout -k 10 "$DEMO_TIMEOUT_S" "$PY" examples/demo.py 2>&1 | tee -a "$BENCH_LOG" || rc=$?
  phase_end $rc "$(grep -E '^offloading kept' "$BENCH_LOG" | tail -n 1)"
fi

# ---------------------------------------------------------------- benchmarks
# BENCHES picks the benchmarks (space-separated): hidden_states activations compile layers modules.
for bench in ${BENCHES:-hidden_states}; do
  if [ "$SKIP_BENCH" = 1 ]; then
    echo "bench   skipped         SKIP_BENCH=1" >>"$SUMMARY"
    break
  fi
  phase_start "$bench"
  rc=0
  echo "===== benchmarks/bench_${bench}.py" >>"$BENCH_LOG"
  case "$bench" in
    hidden_states)
      left=$(( TOTAL_BUDGET_S - ($(now) - T0) - 15 ))
      [ $left -lt 90 ] && left=90  # always try at least the smallest sequence length
      read -r -a extra <<<"${BENCH_ARGS:-}"
      timeout -k 10 $(( left + 90 )) "$PY" benchmarks/bench_hidden_states.py \
        --seqs "$BENCH_SEQS" --skip "$BENCH_SKIP" --variants "$BENCH_VARIANTS" \
        --variant-budget-s "$BENCH_VARIANT_BUDGET_S" --deadline-s "$left" --out "$OUTDIR" \
        ${extra[@]+"${extra[@]}"} 2>&1 | tee -a "$BENCH_LOG" || rc=$?
      ;;
    activations | compile | layers | modules)
      read -r -a extra <<<"${ACT_ARGS:-}"
      timeout -k 10 "${BENCH_TIMEOUT_S:-560}" "$PY" "benchmarks/bench_${bench}.py" --out "$OUTDIR" \
        ${extra[@]+"${extra[@]}"} 2>&1 | tee -a "$BENCH_LOG" || rc=$?
      ;;
    *)
      echo "unknown benchmark $bench" | tee -a "$BENCH_LOG"
      rc=2
      ;;
  esac
  phase_end $rc "$(cd "$OUTDIR" && find . -maxdepth 1 -name "${bench}_*" -printf '%f ')"
  [ $rc != 0 ] && show_tail "$BENCH_LOG" 30
done

# ---------------------------------------------------------------- summary
{
  echo
  for md in "$OUTDIR"/*.md; do
    [ -f "$md" ] && cat "$md"
  done
  echo "total $(( $(now) - T0 ))s"
  not_run=""
  [ ${#NOT_RUN[@]} -gt 0 ] && not_run=" (NOT RUN: ${NOT_RUN[*]})"
  if [ ${#FAILED[@]} -eq 0 ]; then
    echo "RESULT: OK$not_run"
  else
    echo "RESULT: FAILED (${FAILED[*]})$not_run"
  fi
} >>"$SUMMARY"
# With more than PACK_OVER files, pack them (summary.txt stays loose).
PACK_OVER=${PACK_OVER:-8}
if [ "$PACK_OVER" -gt 0 ] && [ "$(find "$OUTDIR" -mindepth 1 -maxdepth 1 -type f | wc -l)" -gt "$PACK_OVER" ]; then
  (cd "$OUTDIR" && tar czf gpu_check.tar.gz --exclude=summary.txt --exclude=gpu_check.tar.gz ./* &&
    find . -mindepth 1 -maxdepth 1 -type f ! -name summary.txt ! -name gpu_check.tar.gz -delete)
fi
echo
echo "================================ summary.txt"
cat "$SUMMARY"
echo "files in $OUTDIR: $(cd "$OUTDIR" && find . -mindepth 1 -maxdepth 1 -printf '%f ')"
[ ${#FAILED[@]} -eq 0 ]
