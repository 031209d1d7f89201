#!/usr/bin/env bash
# Builds torch_offload and its GoogleTest suite with AddressSanitizer + UndefinedBehaviorSanitizer
# (-DTORCH_OFFLOAD_SANITIZE=ON) and runs the suite under ctest.
#
#   scripts/sanitize.sh [BUILD_DIR]        (default: <repo>/build-asan)
#
# Environment:
#   TORCH_OFFLOAD_VENV  venv whose torch is built against (default ~/.cache/torch_offload/venv)
#   JOBS                parallel compile jobs (default: nproc)
#   CTEST_ARGS          extra ctest arguments, e.g. CTEST_ARGS="-R Manager"
#
# torch itself is not instrumented, but ASan intercepts every malloc/free in the process, so
# LeakSanitizer stays on for everything. tests/lsan.supp is where a narrow suppression for torch's or
# the CUDA runtime's process-lifetime allocations would go; none is needed today (see that file).
# Exits non-zero when the build fails, a test fails, or a sanitizer reports anything.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo/build-asan}"
venv="${TORCH_OFFLOAD_VENV:-$HOME/.cache/torch_offload/venv}"
python="$venv/bin/python"
if [[ ! -x "$python" ]]; then
  echo "sanitize.sh: no Python at $python (set TORCH_OFFLOAD_VENV to the venv with torch)" >&2
  exit 2
fi
export PATH="$venv/bin:$PATH"
torch_prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"

# Sanitizer runtime options; ctest (and the gtest listing run at ctest time) inherit them.
#   protect_shadow_gap=0   the CUDA driver maps memory where ASan keeps its shadow gap;
#   detect_leaks=1         LeakSanitizer on, narrowed by tests/lsan.supp;
#   halt_on_error / -fno-sanitize-recover: the first report fails the test.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}protect_shadow_gap=0:detect_leaks=1:halt_on_error=1:abort_on_error=0:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$repo/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1"

cmake -S "$repo" -B "$build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DTORCH_OFFLOAD_SANITIZE=ON \
  -DTORCH_OFFLOAD_BUILD_TESTS=ON
cmake --build "$build" -j "${JOBS:-$(nproc)}"

cd "$build"
# shellcheck disable=SC2086
ctest --output-on-failure --timeout 600 ${CTEST_ARGS:-}
