"""Dropping a manager while its copies are still queued neither hangs nor crashes (CUDA: the
background releaser only runs for asynchronous device copies)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from python_tests.support.devices import cuda_only

HERE = Path(__file__).resolve().parents[1] / "support"  # where the script is


@cuda_only
@pytest.mark.cuda
@pytest.mark.parametrize("order", ["drop_handles_then_manager", "drop_manager_then_handles"])
def test_dropping_a_manager_with_copies_in_flight_returns(order):
    # The script runs from python_tests/support/: put the source tree on its path, as it is on this
    # process's (where the package is not installed, as on the GPU machine, it would not import).
    path = os.pathsep.join(p for p in (str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")) if p)
    run = subprocess.run([sys.executable, str(HERE / "manager_drop_script.py"), order],
                         capture_output=True, text=True, timeout=120, cwd=HERE, env=dict(os.environ, PYTHONPATH=path))
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert run.stdout.strip().endswith("ok")
