"""Dropping a manager while its copies are still queued neither hangs nor crashes (CUDA: the
background releaser only runs for asynchronous device copies); a manager whose background thread
the system cannot start is a clear error."""
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from python_tests.support.devices import cuda_only

HERE = Path(__file__).resolve().parents[1] / "support"  # where the script is
SOURCE = HERE.parents[1]  # the source tree, put first on the subprocesses' path


@cuda_only
@pytest.mark.cuda
@pytest.mark.parametrize("order", ["drop_handles_then_manager", "drop_manager_then_handles"])
def test_dropping_a_manager_with_copies_in_flight_returns(order):
    # The script runs from python_tests/support/: put the source tree on its path, as it is on this
    # process's (where the package is not installed, as on the GPU machine, it would not import).
    path = os.pathsep.join(p for p in (str(SOURCE), os.environ.get("PYTHONPATH", "")) if p)
    run = subprocess.run([sys.executable, str(HERE / "manager_drop_script.py"), order],
                         capture_output=True, text=True, timeout=120, cwd=HERE, env=dict(os.environ, PYTHONPATH=path))
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert run.stdout.strip().endswith("ok")


# Thread stacks of 64 MiB (glibc sizes them from RLIMIT_STACK at the start of the process) and none
# reused from a cache; then an address-space limit 16 MiB above what the process maps: no thread can
# get a stack, while small allocations still fit. Unlike RLIMIT_NPROC, RLIMIT_AS binds root too.
_THREAD_STACK = 64 << 20
_NO_THREAD_SCRIPT = textwrap.dedent("""
    import resource, threading
    import torch_offload

    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (16 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        threading.Thread(target=lambda: None).start()
        print("a thread started")
    except RuntimeError:
        try:
            torch_offload.OffloadManager()
            print("a manager was made")
        except RuntimeError as error:
            print(error)
""")


def _thread_stack_limit():
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    resource.setrlimit(resource.RLIMIT_STACK, (_THREAD_STACK, hard))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the limits are Linux's")
def test_a_releaser_thread_that_cannot_start_is_a_clear_error():
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    if hard != resource.RLIM_INFINITY and hard < _THREAD_STACK:
        pytest.skip(f"the hard stack limit ({hard} bytes) is below the {_THREAD_STACK} this test needs")
    path = os.pathsep.join(p for p in (str(SOURCE), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, GLIBC_TUNABLES="glibc.pthread.stack_cache_size=0")
    run = subprocess.run([sys.executable, "-c", _NO_THREAD_SCRIPT], capture_output=True, text=True, timeout=120,
                         cwd=HERE, env=env, preexec_fn=_thread_stack_limit)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    if run.stdout.startswith("a thread started"):
        pytest.skip("the address-space limit does not stop threads from starting here")
    message = run.stdout
    for part in ("torch_offload: cannot start the offload manager's releaser thread",
                 "Resource temporarily unavailable", "limit of threads", "ulimit -u"):
        assert part in message, message
