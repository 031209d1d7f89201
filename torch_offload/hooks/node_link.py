"""The host link as the ranks of a node share it, and one figure for every rank.

The GPUs of a node copy to host memory through the host's links and memory, which they share: four
ranks copying at once each get about 62% of what one GPU alone gets (docs/performance.md). So a
rank's share of the link is measured with every rank copying at the same time, once per process,
and every rank takes the smallest figure. The modes that budget their copies by it
(hooks/link_budget.py) and mode "auto" then decide the same on every rank.

The measurement and agree() are collectives when a process group of several ranks is initialised:
every rank calls them at the same point of its training step, as it does the model's forward.
"""
import torch
import torch.distributed as dist

COPY_BYTES = 256 << 20
COPIES = 6  # back to back, so that ranks starting a moment apart still copy together
_bandwidth = {}  # device index -> device-to-host bytes/s


def ranks() -> int:
    """The ranks of the initialised process group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def agree(values, op: str) -> list:
    """`values` (numbers) reduced element-wise over every rank with `op`, "min" or "max": the same
    list on every rank. With one rank, `values` as they are."""
    values = [float(v) for v in values]
    if ranks() == 1:
        return values
    reduce_op = {"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
    # A gloo group reduces host tensors; NCCL only device tensors.
    on_host = "gloo" in str(dist.get_backend()) or not torch.cuda.is_available()
    device = torch.device("cpu") if on_host else torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=reduce_op)
    return tensor.tolist()


def link_bandwidth(device: torch.device) -> float:
    """Device-to-pinned-host bytes/s this rank gets while every rank copies at once (alone, with
    one rank): measured once per device, the smallest of all ranks' figures."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _bandwidth:
        src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=torch.device("cuda", index))
        dst = torch.empty(src.shape, dtype=torch.uint8, pin_memory=True)
        dst.copy_(src)  # the first copy maps the pinned pages
        torch.cuda.synchronize(index)
        agree([0], "max")  # every rank is here: the copies below run together
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(COPIES):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        own = COPY_BYTES * COPIES / (start.elapsed_time(end) / 1e3)
        _bandwidth[index] = agree([own], "min")[0]
    return _bandwidth[index]
