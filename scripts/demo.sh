#!/usr/bin/env bash
# README command 1: set everything up, build the library, and run the main demo.
set -euo pipefail
requirements_set=demo  # requirements/demo.txt: torch, transformers, build tools
source "$(dirname "$0")/setup_env.sh"
"$repo_root/scripts/build.sh" torch_offload_python  # the library and the C save hooks; tests and C++ examples are scripts/test.sh's
cd "$repo_root"
python examples/demo.py "$@"
