"""offload_activations(): saved-tensor hooks that move every large saved activation off the GPU
through the C++ ops (no Python-side copies), and bring it back, prefetched, in backward.

Modes: "all" (alias "true"): asynchronous copies on a side stream, bounded in flight, prefetched in
backward. "sync" (alias "legacy"): each copy completes before forward goes on, no prefetch: the
lowest resident memory, and a baseline for debugging. "disk": each activation goes through a pinned
staging buffer to a file in `disk_dir`, written and read back (ahead of need) by IO threads; files
are removed as soon as autograd releases them, and in any case when the manager goes away.
In "all" mode, a `disk_dir` together with `host_budget_bytes` makes tensors that would exceed the
budget spill to disk instead of failing.
In every mode a storage region saved several times (a linear's input for q/k/v, a tensor and its
transpose) is copied once and restored once per backward (saved_regions.py).
"""
import os
import tempfile
from typing import Callable, Iterable, Optional

import torch

from ._ops import offload_restore, offload_save

try:  # DTensor (tensor parallel / FSDP2 shards): offload the local shard, rebuild on restore
    from torch.distributed.tensor import DTensor
except ImportError:  # torch built without distributed
    DTensor = None
from . import weight_tokens
from .manager import OffloadManager, register_stats_source
from .manager import reset_stats as manager_reset_stats
from .manager import stats as manager_stats
from .saved_regions import SavedRegions, SaveCounters, SharedSave, compact_layout, rebuild_layout

MODE_ALIASES = {"all": "all", "true": "all", "sync": "sync", "legacy": "sync", "disk": "disk"}
DEFAULT_DISK_DIR = os.path.join(tempfile.gettempdir(), "torch_offload")


def canonical_mode(mode) -> str:
    key = "true" if mode is True else str(mode).lower()
    if key not in MODE_ALIASES:
        raise ValueError(
            f"torch_offload: unknown activation offloading mode {mode!r}; expected one of "
            f"{sorted(MODE_ALIASES)} (or True)"
        )
    return MODE_ALIASES[key]


class _Packed:
    """What autograd keeps instead of an offloaded tensor: the host handle plus how to rebuild the
    original view (same sizes and strides) from the contiguous copy, and for a DTensor its mesh,
    placements and global shape (only the local shard is offloaded)."""

    __slots__ = ("handle", "device", "permutation", "expanded_sizes", "dtensor_spec")

    def __init__(self, handle, device, permutation, expanded_sizes, dtensor_spec=None):
        self.handle = handle
        self.device = device
        self.permutation = permutation
        self.expanded_sizes = expanded_sizes
        self.dtensor_spec = dtensor_spec


def _compact(t: torch.Tensor):
    """A contiguous tensor holding exactly t's data, and how to get t's layout back."""
    return compact_layout(t)


def _rebuild(restored: torch.Tensor, packed: _Packed) -> torch.Tensor:
    return rebuild_layout(restored, packed.permutation, packed.expanded_sizes)


def _is_dtensor(t: torch.Tensor) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def _is_weight(t: torch.Tensor) -> bool:
    """Parameters, leaves that require grad, and views of them (autograd saves weight.t())."""
    base = t._base if t._base is not None else t
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


def resident_tensors(model: torch.nn.Module) -> list:
    """A model's parameters and buffers: pass as `keep` so that no view of them is offloaded."""
    return list(model.parameters()) + list(model.buffers())


class offload_activations(torch.autograd.graph.saved_tensors_hooks):
    """Context manager: tensors that autograd saves inside it are offloaded.

    Kept on the device: parameters, leaves that require grad and views of either, tensors sharing
    storage with a tensor in `keep` (apply() passes the model's parameters and buffers), tensors
    smaller than `min_bytes`. Options: `max_in_flight` (copies in flight before forward blocks),
    `prefetch_depth` (tensors copied back ahead of need in backward), `host_budget_bytes`
    (0 = unlimited), `disk_dir` (the disk tier: where "disk" writes, where "all" spills), or a
    ready `manager`. `on_offload(t)` is called with each tensor offloaded (modules mode counts them).
    """

    def __init__(
        self,
        mode="all",
        *,
        min_bytes: int = 1 << 20,
        max_in_flight: int = 4,
        prefetch_depth: int = 4,
        host_budget_bytes: int = 0,
        manager: Optional[object] = None,
        keep: Iterable[torch.Tensor] = (),
        disk_dir: Optional[str] = None,
        on_offload: Optional[Callable[[torch.Tensor], None]] = None,
    ):
        self.mode = canonical_mode(mode)
        self.min_bytes = min_bytes
        if manager is None:
            if self.mode == "disk" and disk_dir is None:
                disk_dir = DEFAULT_DISK_DIR
            manager = OffloadManager(
                max_in_flight=max_in_flight,
                prefetch_depth=0 if self.mode == "sync" else prefetch_depth,
                host_budget_bytes=host_budget_bytes,
                synchronous=self.mode == "sync",
                disk_dir=disk_dir or "",
                disk_only=self.mode == "disk",
            )
        self.manager = manager
        manager_id = manager.id()
        min_bytes = self.min_bytes
        # Storages that stay resident whatever views of them autograd saves (model weights, buffers).
        kept_storages = {t.untyped_storage().data_ptr() for t in keep}

        # Saves of one storage region share one copy (saved_regions.py); counters for stats().
        self.counters = SaveCounters()
        self.regions = regions = SavedRegions(manager_id, self.counters)
        register_stats_source(manager, self.counters)
        counters = self.counters

        def offload(t: torch.Tensor):
            if on_offload is not None:
                on_offload(t)
            if SavedRegions.handles(t):
                return regions.pack(t)
            # Tensor subclasses and empty tensors: one copy per save.
            source, permutation, expanded_sizes = _compact(t.detach())
            nbytes = t.numel() * t.element_size()
            counters.add(offloaded_saves=1, saved_bytes=nbytes, distinct_bytes_saved=nbytes)
            return _Packed(offload_save(source, manager_id), t.device, permutation, expanded_sizes)

        def pack_local(t: torch.Tensor):
            """Packed object for an offloaded tensor, or t itself where it stays on the device."""
            if _is_dtensor(t):
                if _is_weight(t):
                    return t
                packed = pack_local(t.to_local())
                if isinstance(packed, torch.Tensor):
                    return t  # the shard stays (small, or a weight)
                packed.dtensor_spec = (t.device_mesh, t.placements, t.shape, t.stride())
                return packed
            if (
                t.numel() * t.element_size() < min_bytes
                or t.layout != torch.strided
                or _is_weight(t)
                or (kept_storages and t.untyped_storage().data_ptr() in kept_storages)
            ):
                return t
            return offload(t)

        def pack(t: torch.Tensor):
            token = weight_tokens.pack(t)
            if token is not None:  # a frozen weight of an offloaded layer: fetched again in backward
                return token
            packed = pack_local(t)
            counters.add(saved_tensors=1)
            if isinstance(packed, torch.Tensor):
                local = t.to_local() if _is_dtensor(t) else t
                counters.add(kept_saves=1, kept_bytes=local.numel() * local.element_size())
            return packed

        def unpack(packed):
            if isinstance(packed, torch.Tensor):
                return packed
            if isinstance(packed, weight_tokens.WeightToken):
                return packed.unpack()
            if isinstance(packed, SharedSave):
                restored = packed.unpack(manager_id)
            else:
                restored = _rebuild(offload_restore(packed.handle, packed.device, manager_id), packed)
            if packed.dtensor_spec is not None:
                mesh, placements, shape, stride = packed.dtensor_spec
                restored = DTensor.from_local(restored, mesh, placements, run_check=False,
                                              shape=shape, stride=stride)
            return restored

        super().__init__(pack, unpack)

    def __enter__(self):
        super().__enter__()
        return self

    def stats(self) -> dict:
        """The manager's statistics (copies, bytes each way, waits) and, merged in, the hooks'
        counters of every hook set on that manager (see manager.stats)."""
        return manager_stats(self.manager)

    def reset_stats(self) -> None:
        manager_reset_stats(self.manager)
