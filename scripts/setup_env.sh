# Sourced by the other scripts: creates (or reuses) the pinned virtual environment and activates it.
# The caller names the requirements it needs in `requirements_set` before sourcing: demo
# (requirements/demo.txt: torch, transformers, build tools; the default) or test
# (requirements/test.txt: demo's and everything the tests use). The venv lives outside the clone so
# CI and later checkouts reuse it; a set is installed again whenever its files change (a stamp per
# set holds their hash), and the venv is created from scratch when absent. Installing pins that are
# already installed downloads nothing, so a populated venv does not fetch torch again.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TORCH_OFFLOAD_VENV:-$HOME/.cache/torch_offload/venv}"
requirements_set="${requirements_set:-demo}"

# The hash of a set: its file and the files it includes, in order (test.txt includes demo.txt).
_requirements_hash() {
  case "$1" in
    demo) cat "$repo_root/requirements/demo.txt" ;;
    test) cat "$repo_root/requirements/demo.txt" "$repo_root/requirements/test.txt" ;;
    *) echo "[setup] unknown requirements set '$1' (demo or test)" >&2; return 1 ;;
  esac | sha256sum | cut -d' ' -f1
}
_requirements_installed() {
  [ "$(cat "$venv/.requirements-$1.sha256" 2>/dev/null)" = "$(_requirements_hash "$1")" ]
}

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating virtual environment at $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
# demo is part of test: a venv set up for the tests serves the demo as it is.
if ! _requirements_installed "$requirements_set" \
   && ! { [ "$requirements_set" = demo ] && _requirements_installed test; }; then
  echo "[setup] installing requirements/$requirements_set.txt (torch is several GB the first time)"
  "$venv/bin/python" -m pip install -q -r "$repo_root/requirements/$requirements_set.txt"
  _requirements_hash "$requirements_set" > "$venv/.requirements-$requirements_set.sha256"
  if [ "$requirements_set" = test ]; then
    _requirements_hash demo > "$venv/.requirements-demo.sha256"
  fi
fi
export PATH="$venv/bin:$PATH"
export VIRTUAL_ENV="$venv"
