"""Deterministic provocation (torch only, no torch_offload imported): rank 0's gloo worker thread
must drop the last C++ reference to a finished collective's Python tensor (since torch 2.10 that
takes the GIL, in the noexcept TensorImpl::decref_pyobject) while the main thread keeps the GIL
until the interpreter has started finalising. A reference to the process group outlives
destroy_process_group, as FSDP2's DeviceMesh keeps one.
Usage: gloo_exit_det.py [--os-exit]"""
import os, sys, time
import torch, torch.distributed as dist
import torch.multiprocessing as mp


class SleepsAtFinalisation:
    def __del__(self):
        time.sleep(0.5)  # releases the GIL while the interpreter finalises


def rank_main(rank, port, os_exit):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    global keep_pg, sleeper
    keep_pg = dist.group.WORLD
    sleeper = SleepsAtFinalisation()
    dist.barrier()
    t = torch.ones(1 << 16)
    if rank == 1:
        time.sleep(1.0)
    work = dist.all_reduce(t, async_op=True)
    if rank == 1:
        work.wait()
    del work, t  # rank 0: the gloo worker thread now holds the last reference
    if rank == 0:
        sys.setswitchinterval(1e6)  # the main thread keeps the GIL while it runs bytecode...
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # ...while rank 1 joins and the worker finishes
            pass
    dist.destroy_process_group()
    if os_exit:
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = mp.start_processes(rank_main, args=(port, "--os-exit" in sys.argv), nprocs=2, join=False,
                             start_method="spawn")
    try:
        while not ctx.join(timeout=60):
            pass
        print("ok")
    except mp.ProcessExitedException as e:
        print("CRASH", e.signal_name, e)
        sys.exit(3)
