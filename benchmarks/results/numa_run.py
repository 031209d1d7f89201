"""Runs a Python script with the process bound to one NUMA node: its threads on that node's CPUs and
its memory (pinned host buffers included) allocated there (set_mempolicy MPOL_BIND), before torch
loads. Session 22's check of whether the host side of a 4k modules step depends on where the
process and its host buffers sit relative to the GPU.

    python3 benchmarks/results/numa_run.py NODE SCRIPT [ARGS...]
"""
import ctypes, os, runpy, sys

node = int(sys.argv[1])


def cpulist(text):
    cpus = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


cpus = cpulist(open(f"/sys/devices/system/node/node{node}/cpulist").read())
os.sched_setaffinity(0, cpus)
libc = ctypes.CDLL(None, use_errno=True)
mask = ctypes.c_ulong(1 << node)
MPOL_BIND, SYS_set_mempolicy = 2, 238  # x86_64
if libc.syscall(SYS_set_mempolicy, MPOL_BIND, ctypes.byref(mask), 64) != 0:
    raise OSError(ctypes.get_errno(), "set_mempolicy failed")
print(f"numa_run: node {node}, cpus {min(cpus)}-{max(cpus)} ({len(cpus)}), memory bound there", flush=True)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
