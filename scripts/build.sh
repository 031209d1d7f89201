#!/usr/bin/env bash
# Configures and builds into build/ (incremental): every target, or the ones named
# (scripts/demo.sh builds only the library: scripts/build.sh torch_offload).
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"
cd "$repo_root"
# torch.utils.cmake_prefix_path, without the ~2 s of importing torch.
torch_cmake="$(python -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("torch").origin), "share", "cmake"))')"
cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH="$torch_cmake" >/dev/null
cmake --build build -j"$(nproc)" ${1:+--target "$@"}
