"""DTensors (tensor / sequence / context parallel activations, FSDP2 shards) through the engine.

The engine copies dense local tensors only, and a DTensor's data is its local shard. So a DTensor is
offloaded as its local shard together with what makes it a DTensor again (mesh, placements, global
shape and stride), and rebuilt around the restored shard without communication.
"""
import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch built without distributed
    DTensor = None


def is_dtensor(t) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def split_local(t: torch.Tensor):
    """(local shard, spec) of a DTensor; (t, None) for any other tensor."""
    if not is_dtensor(t):
        return t, None
    return t.to_local(), (t.device_mesh, t.placements, t.shape, t.stride())


def join_local(local: torch.Tensor, spec) -> torch.Tensor:
    """The DTensor `spec` (from split_local) describes, around `local`; `local` itself when spec is None.
    Differentiable: a gradient of the DTensor flows to `local`."""
    if spec is None:
        return local
    mesh, placements, shape, stride = spec
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape, stride=stride)
