"""Host memory shared by the ranks of one node.

Under torchrun every rank has its own manager and pinned pool, but the ranks of a node share its
host RAM. `node_host_budget_bytes=` (OffloadManager, apply, offload_activations, offload_layers)
is the most host memory all ranks of the node may hold together: each rank gets an equal share,
node_host_budget_bytes // LOCAL_WORLD_SIZE, as its host_budget_bytes. A rank that goes over its
share gets an error naming the node budget. gather_stats() collects each rank's statistics on one
rank (for logging the whole node, or the whole job, in one place).
"""
import os
import threading
from typing import List, Optional

_lock = threading.Lock()
_shares = {}  # manager id -> (node_host_budget_bytes, local_world_size), managers given one


def host_memory_bytes(field: str) -> Optional[int]:
    """A field of /proc/meminfo in bytes ("MemTotal", "MemAvailable"); None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def local_world_size() -> int:
    """Ranks on this node: torchrun's LOCAL_WORLD_SIZE (1 when not launched by torchrun)."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "1")
    try:
        ranks = int(value)
    except ValueError:
        ranks = 0
    if ranks < 1:
        raise ValueError(f"torch_offload: LOCAL_WORLD_SIZE={value!r} is not a positive number of ranks")
    return ranks


def rank_share(node_host_budget_bytes: int, host_budget_bytes: int = 0) -> int:
    """This rank's host budget: node_host_budget_bytes // LOCAL_WORLD_SIZE."""
    if host_budget_bytes:
        raise ValueError("torch_offload: pass either node_host_budget_bytes (shared by the ranks of "
                         "a node) or host_budget_bytes (this rank alone), not both")
    if node_host_budget_bytes < 0:
        raise ValueError(f"torch_offload: node_host_budget_bytes={node_host_budget_bytes} is negative")
    ranks = local_world_size()
    share = node_host_budget_bytes // ranks
    if share == 0:
        raise ValueError(f"torch_offload: node_host_budget_bytes={node_host_budget_bytes} split over "
                         f"LOCAL_WORLD_SIZE={ranks} ranks leaves no host memory to each rank")
    return share


def register(manager, node_host_budget_bytes: int) -> None:
    """Records that `manager`'s budget is this rank's share of a node budget (for error messages)."""
    with _lock:
        _shares[manager.id()] = (node_host_budget_bytes, local_world_size())


def name_in_error(error: RuntimeError, manager_id: int) -> None:
    """Re-raises a host-budget error of a manager built from node_host_budget_bytes so that it
    names the node budget the user set; returns for any other error (the caller re-raises it)."""
    with _lock:
        share = _shares.get(manager_id)
    if share is None or "host_budget_bytes=" not in str(error):
        return
    node_bytes, ranks = share
    raise RuntimeError(
        f"torch_offload: this rank is over its share of node_host_budget_bytes={node_bytes}: "
        f"{node_bytes // ranks} bytes each for LOCAL_WORLD_SIZE={ranks} ranks. Raise "
        f"node_host_budget_bytes, give a disk_dir to spill to, or offload fewer tensors. ({error})"
    ) from error


def gather_stats(source, dst: int = 0, group=None) -> Optional[List[dict]]:
    """Each rank's statistics (`source`: an OffloadManager, or a handle with stats()) gathered on
    the rank `dst` (a global rank): a list indexed by the ranks of `group` there, None on the other ranks. Every rank must call it
    (it is a collective; with NCCL, set the CUDA device of each rank first)."""
    import torch.distributed as dist

    stats = dict(source.stats())
    if not dist.is_available() or not dist.is_initialized():
        return [stats]
    gathered = [None] * dist.get_world_size(group) if dist.get_rank() == dst else None
    dist.gather_object(stats, gathered, dst=dst, group=group)
    return gathered
