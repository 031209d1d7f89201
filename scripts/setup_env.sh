# Sourced by the other scripts: creates (or reuses) the pinned virtual environment and activates it.
# The venv lives outside the clone so CI and later checkouts reuse it; it is rebuilt whenever
# requirements.txt changes, and created from scratch when absent.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TORCH_OFFLOAD_VENV:-$HOME/.cache/torch_offload/venv}"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$repo_root/requirements.txt" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating virtual environment at $venv"
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing pinned requirements (torch is several GB the first time)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$repo_root/requirements.txt"
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export VIRTUAL_ENV="$venv"
