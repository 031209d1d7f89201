#!/usr/bin/env bash
# Configures and builds libtorch_offload and the C++ tests into build/ (incremental).
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"
cd "$repo_root"
cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH="$(python -c 'import torch;print(torch.utils.cmake_prefix_path)')" >/dev/null
cmake --build build -j"$(nproc)"
