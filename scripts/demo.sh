#!/usr/bin/env bash
# README command 1: set everything up, build, and run the main demo.
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"
"$repo_root/scripts/build.sh"
cd "$repo_root"
python examples/demo.py "$@"
