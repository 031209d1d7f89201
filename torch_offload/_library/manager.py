"""OffloadManager construction, the process-wide default manager, and statistics: the manager's
own (C++) counters merged with those of the Python hooks that use it. The engine's defaults,
decision codes and statistics' names are declared once, in C++, and read here from the library."""
import collections
import os
import tempfile
import threading
import weakref

import torch

from . import node_budget
from .loading import load_library

load_library()  # torch.classes.offload.OffloadManager, torch.ops.offload.*


def _named(type_name: str, values) -> tuple:
    """`values` (name -> value) as a namedtuple: read by attribute, immutable."""
    values = dict(values)
    return collections.namedtuple(type_name, values)(**values)


# The defaults of the manager's integer options (max_in_flight, prefetch_depth, host_budget_bytes,
# keep_on_device_bytes, disk_io_threads): ManagerConfig's, csrc/manager_config.h.
MANAGER_DEFAULTS = _named("ManagerDefaults", torch.ops.offload.manager_defaults())
# The codes offload_pack_filtered returns for the save hooks' filter's decisions (offload, keep,
# caller_decides, leaf_without_grad): csrc/save_decision.h.
DECISIONS = _named("SaveDecisions", torch.ops.offload.save_decisions())
# The names of the engine's statistics, the keys of manager.stats(): csrc/offload_stats.h.
STAT_NAMES = tuple(torch.ops.offload.stat_names())
# Where the disk tier writes when mode="disk" is given no disk_dir.
DEFAULT_DISK_DIR = os.path.join(tempfile.gettempdir(), "torch_offload")
_default = None
_default_lock = threading.Lock()
_stats_sources = {}  # manager id -> WeakSet of objects with snapshot() -> dict and reset()
_stats_lock = threading.Lock()


def hooks_mode_settings(mode: str, disk_dir: str = "") -> dict:
    """What the save hooks' modes "sync" and "disk" change of the manager of mode "all": "sync"
    finishes every copy before the save returns and prefetches nothing; "disk" writes every save to
    disk_dir (DEFAULT_DISK_DIR where none is given). One place for it: the modes' options and
    offload_activations both build their manager with it."""
    if mode == "sync":
        return dict(synchronous=True, prefetch_depth=0)
    if mode == "disk":
        return dict(disk_only=True, disk_dir=disk_dir or DEFAULT_DISK_DIR)
    return {}


class _ManagerClass(type):
    """isinstance(x, OffloadManager): whether x is a torch.classes.offload.OffloadManager (a
    ScriptObject, whatever built it)."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.ScriptObject) and obj._type().qualified_name() == _QUALIFIED_NAME


_QUALIFIED_NAME = "__torch__.torch.classes.offload.OffloadManager"


class OffloadManager(metaclass=_ManagerClass):
    """The offload manager: the TorchScript class torch.classes.offload.OffloadManager (one name
    for one thing: calling this builds one with keyword options, isinstance() recognises any). The
    C++ engine behind it is csrc/manager.h's Manager."""

    def __new__(
        cls,
        max_in_flight: int = MANAGER_DEFAULTS.max_in_flight,
        prefetch_depth: int = MANAGER_DEFAULTS.prefetch_depth,
        host_budget_bytes: int = MANAGER_DEFAULTS.host_budget_bytes,
        synchronous: bool = False,
        disk_dir: str = "",
        disk_only: bool = False,
        release_sources_on_save: bool = False,
        node_host_budget_bytes: int = 0,
        keep_on_device_bytes: int = MANAGER_DEFAULTS.keep_on_device_bytes,
        disk_direct_io=False,
        disk_io_threads: int = MANAGER_DEFAULTS.disk_io_threads,
    ):
        """A torch.classes.offload.OffloadManager with these options.

        max_in_flight: device-to-host copies allowed in flight before saving blocks (0 = unbounded).
        prefetch_depth: earlier-saved tensors copied back ahead of need when one is restored (the
            manager's set_prefetch_depth(n) changes it).
        host_budget_bytes: most host memory the manager's buffer pool may hold (0 = unlimited).
        synchronous: every copy completes before offload_save returns; no prefetch ("sync" mode).
        disk_dir: directory of the disk tier. With disk_only every tensor is written there ("disk"
            mode); otherwise tensors that would exceed host_budget_bytes spill there.
        release_sources_on_save: each save releases the device sources of earlier saves in stream
            order (free when saves are a layer apart; used by torch_offload.compile).
        node_host_budget_bytes: instead of host_budget_bytes, the host memory all ranks of this node
            may hold together; this rank gets node_host_budget_bytes // LOCAL_WORLD_SIZE (node_budget.py).
        keep_on_device_bytes: the newest saves, up to this many bytes, stay on the device instead of
            being copied; each is copied only when newer saves push it out. Backward restores the newest
            saves first, so a forward's last saves never cross the link: GPU memory spent where the link
            cannot carry the last copies of a forward before backward needs them (mode="auto" sizes it
            from the memory budget; apply(mode="all" | "modules", keep_on_device_bytes="auto") from the
            link, each step: hooks/link_budget.py). Not with synchronous or disk_dir. The
            manager's set_keep_on_device_bytes(n) changes it between steps.
        disk_direct_io: the disk tier's files bypass the page cache (O_DIRECT): for hosts whose RAM
            cannot hold what goes to disk, where the page cache only adds a copy of every byte and
            pushes other data out. Off by default: with RAM to spare the page cache serves backward's
            reads at memory speed. Where the filesystem refuses O_DIRECT a warning says so and
            stats()["disk_direct_io"] is 0. Needs disk_dir. disk_direct_io="auto": each file decides
            when it is made, going around the page cache once the host's available RAM (MemAvailable)
            cannot hold it beside the files already kept through the page cache and 1 GiB for
            everything else; stats()["disk_direct_io"] is 2 and disk_bytes_written_direct says how
            much went around it.
        disk_io_threads: the disk tier's IO threads, each writing one file at a time from its staging
            buffer: saves wait while this many writes are under way, so it also bounds the host memory
            the writes' staging buffers hold. More threads shorten the forward's wait for writes where
            the host has CPUs and RAM to spare (docs/performance.md). Needs disk_dir to differ from the
            default.
        """
        if disk_direct_io not in (True, False, "auto") or not isinstance(disk_direct_io, (bool, str)):
            raise ValueError(f"torch_offload.OffloadManager: disk_direct_io={disk_direct_io!r}; expected "
                             "True, False or 'auto'")
        if "\0" in str(disk_dir):
            raise ValueError(f"torch_offload.OffloadManager: disk_dir={disk_dir!r} contains a NUL character "
                             "('\\0'); a path cannot contain one: pass the directory's path without it")
        if keep_on_device_bytes == "auto":
            raise ValueError("torch_offload.OffloadManager: keep_on_device_bytes='auto' is taken by "
                             "apply(mode='all' | 'modules'), which size the window from the link each step; "
                             "OffloadManager takes a number of bytes (set_keep_on_device_bytes() changes it)")
        if node_host_budget_bytes:
            host_budget_bytes = node_budget.rank_share(node_host_budget_bytes, host_budget_bytes)
        manager = torch.classes.offload.OffloadManager(
            max_in_flight, prefetch_depth, host_budget_bytes, synchronous, str(disk_dir), disk_only,
            release_sources_on_save, keep_on_device_bytes, disk_direct_io is True, disk_direct_io == "auto",
            disk_io_threads,
        )
        if node_host_budget_bytes:
            node_budget.register(manager, node_host_budget_bytes)
        return manager


def default_manager():
    """The manager used when none is given; created on first use with default settings."""
    global _default
    with _default_lock:
        if _default is None:
            _default = OffloadManager()
        return _default


def register_stats_source(manager, source) -> None:
    """Adds `source`'s counters (snapshot() -> dict, reset()) to stats(manager) while it lives."""
    with _stats_lock:
        _stats_sources.setdefault(manager.id(), weakref.WeakSet()).add(source)


def _sources(manager) -> list:
    with _stats_lock:
        return list(_stats_sources.get(manager.id(), ()))


def stats(manager=None) -> dict:
    """Statistics of `manager` (default: the default manager) as a plain dict: the engine's
    counters (saves, bytes_to_host, bytes_to_device, compute_wait_ms, ...) and, summed over the
    hooks using it, the Python counters (saved_tensors, shared_saves, distinct_bytes_saved,
    kept_bytes, ...; docs/reference/stats.md)."""
    manager = manager if manager is not None else default_manager()
    merged = dict(manager.stats())
    for source in _sources(manager):
        for name, value in source.snapshot().items():
            merged[name] = merged.get(name, 0) + value
    return merged


def reset_stats(manager=None) -> None:
    """Resets the engine's counters and the Python counters of the hooks using `manager`."""
    manager = manager if manager is not None else default_manager()
    manager.reset_stats()
    for source in _sources(manager):
        source.reset()
