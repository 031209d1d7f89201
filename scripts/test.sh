#!/usr/bin/env bash
# README command 2: set everything up, build, and run every test (GoogleTest via ctest, pytest).
# CUDA tests skip cleanly without a GPU. pytest includes the slow tests, among them
# python_tests/packaging/test_build_without_cuda_toolkit.py: a pip install of the package built with
# no CUDA toolkit in sight, in a fresh venv, importing it and training a step.
set -euo pipefail

# pytest on the paths given, quiet, no cache, with pytest's exit status: not 0 when it collected no
# tests (5), since a run that tested nothing has not passed.
run_pytest() {
  local status=0
  python -m pytest "$@" -q -p no:cacheprovider || status=$?
  if [ "$status" -eq 5 ]; then
    echo "[test] pytest collected no tests" >&2
  fi
  return "$status"
}

# Sourced (python_tests/suite/test_test_script.py runs run_pytest so), the script stops here.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  return 0
fi

requirements_set=test  # requirements/test.txt
source "$(dirname "$0")/setup_env.sh"
"$repo_root/scripts/build.sh"
cd "$repo_root"

echo "[test] GoogleTest (ctest)"
ctest --test-dir build --output-on-failure -j2

echo "[test] pip install . (the packaged build is exercised by python_tests/packaging/test_packaging.py)"
# The package gets build/libtorch_offload.so as it is: one compile serves the tests and the package.
python -m pip install -q --no-build-isolation --no-deps \
  --config-settings=cmake.define.TORCH_OFFLOAD_PREBUILT_LIBRARY="$repo_root/build/libtorch_offload.so" .
package_dir="$(cd / && python -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch_offload").origin))')"
cmp "$package_dir/libtorch_offload.so" build/libtorch_offload.so

echo "[test] pytest"
run_pytest python_tests
