"""single_rank_mesh(): a one-process gloo group and its CPU device mesh, in the test process.

Runs a function in N CPU processes joined in a gloo process group (what torchrun would start),
for tests of distributed training on machines without GPUs.

run_ranks(fn, world_size) spawns the ranks; each calls fn(rank, world_size, *args) with the group
initialised and returns a JSON-serialisable value; run_ranks returns rank 0's value. A rank that
raises fails the call with its traceback; ranks still running after `timeout_s` are ended (a
collective that one rank never reaches would otherwise hang the test run).
"""
import contextlib
import datetime
import json
import os
import socket
import sys
import tempfile
import time
import warnings

import torch.distributed as dist
import torch.multiprocessing as mp


@contextlib.contextmanager
def single_rank_mesh():
    """A one-process gloo group (unless one exists) and its CPU device mesh: enough for DTensors and
    fully_shard in the test process itself."""
    import pytest
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_available():
        pytest.skip("torch built without distributed")
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        if owns_group:
            dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, port, result_path, timeout_s, fn, args):
    import faulthandler

    faulthandler.enable(all_threads=True)  # a crash prints every thread's Python stack
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world_size, *args)
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()
    # Leave without finalising the interpreter (see _CRASH_RETRIES); a rank that raised has left
    # above, through torch.multiprocessing's error report.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# A rank process could die by SIGABRT at exit: "terminate called without an active exception", on
# a thread with no Python frame. The cause is in torch (seen with torch 2.11.0 and Python 3.11.7),
# not in torch_offload: it reproduces with torch alone. The aborting thread, from a core dump:
#   c10d::ProcessGroupGloo::runLoop -> ~AsyncAllreduceWork -> AsyncWork::~AsyncWork
#   -> ~vector<vector<at::Tensor>> -> c10::TensorImpl::decref_pyobject() (noexcept)
#   -> ConcretePyInterpreterVTable::decref (torch/csrc/PyInterpreter.cpp) -> gil_scoped_acquire
#   -> PyEval_AcquireThread -> take_gil -> PyThread_exit_thread -> pthread_exit -> std::terminate
# while the main thread was in Py_FinalizeEx. In torch 2.11 a tensor that has a Python object
# keeps that object alive while C++ holds further references to the tensor, so the gloo worker
# thread that drops the last reference to a finished collective's tensors takes the GIL. decref
# checks Py_IsInitialized() and then waits for the GIL; if the interpreter starts finalising in
# between, CPython 3.11 ends the waiting thread with pthread_exit, whose unwinding cannot cross the
# noexcept frame, and std::terminate aborts the process. It takes a worker thread that drops its
# last work only after the main thread has gone on to exit (a loaded machine), in a process group
# still alive then (destroy_process_group joins the worker threads only if nothing else refers to
# the group; the torch-only reproduction keeps a reference). test_gloo_ranks.py provokes it.
# Hence _rank_main ends the rank with os._exit: without interpreter finalisation no thread is ended
# that way. A rank that still dies by a signal is run again, at most twice, with a warning (kept
# as a safety net); a wrong result or a Python error in a rank still fails at once.
_CRASH_RETRIES = 2


def run_ranks(fn, world_size: int = 2, *args, timeout_s: float = 120.0):
    for attempt in range(_CRASH_RETRIES + 1):
        try:
            return _run_ranks_once(fn, world_size, args, timeout_s)
        except mp.ProcessExitedException as crash:
            if crash.signal_name is None or attempt == _CRASH_RETRIES:
                raise
            warnings.warn(f"gloo_ranks: a rank died by {crash.signal_name}; running the ranks again")


def _run_ranks_once(fn, world_size: int, args, timeout_s: float):
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "rank0.json")
        context = mp.start_processes(
            _rank_main, args=(world_size, free_port(), result_path, timeout_s, fn, args),
            nprocs=world_size, join=False, start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1.0):  # raises ProcessRaisedException when a rank fails
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.terminate()
                raise TimeoutError(f"gloo ranks still running after {timeout_s} s")
        with open(result_path) as f:
            return json.load(f)
