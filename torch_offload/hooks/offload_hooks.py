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
transpose) is copied once and restored once per backward (csrc/saved_regions.h).
The hooks autograd calls are C callables where they were built (pyext/save_hooks.cpp): a plain
tensor's save and restore run no Python; the functions here decide everything else, and all of it
where the C hooks are missing.
"""
import copy
import weakref
from typing import Iterable, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .._library.loading import load_save_hooks
from .._library.ops import offload_batch, offload_pack, offload_pack_filtered, offload_restore, offload_save, offload_unpack

from .._library import node_budget
from ..config.aliases import ALIASES, unalias
from ..config.defaults import ACTIVATIONS_MIN_BYTES
from . import weight_tokens
from .._library.dtensors import is_dtensor as _is_dtensor
from .._library.dtensors import join_local, split_local
from .._library.layouts import Packed, compact_layout, rebuild
from ..copy_and_pickle import NotPicklable
from .nothing_offloaded import StepCounts
from .._library.manager import (DECISIONS, MANAGER_DEFAULTS, STAT_NAMES, OffloadManager, hooks_mode_settings,
                               register_stats_source)
from .._library.manager import reset_stats as manager_reset_stats
from .._library.manager import stats as manager_stats
from .save_filter import SaveFilter
from .saved_regions import SavedRegions, SavedView, SaveCounters

HOOK_MODES = ("all", "sync", "disk")  # the modes whose saves these hooks offload
# offload_pack_filtered's decisions that the hooks act on (the engine's codes): kept on the device,
# and a leaf without grad (asked again with not_a_weight=True unless it is a frozen parameter).
KEEP, LEAF_WITHOUT_GRAD = DECISIONS.keep, DECISIONS.leaf_without_grad


def canonical_mode(mode) -> str:
    """The hooks' mode for `mode` (a name, or an alias of the one table, config/aliases.py)."""
    name = unalias(mode)
    if name not in HOOK_MODES:
        names = list(HOOK_MODES) + [alias for alias, target in ALIASES.items() if isinstance(alias, str)]
        raise ValueError(f"torch_offload: unknown activation offloading mode {mode!r}; expected one of {names} "
                         "(or True)")
    return name


def _is_weight(t: torch.Tensor) -> bool:
    """Parameters, leaves that require grad, and views of them (autograd saves weight.t())."""
    base = t._base
    if base is None:
        base = t
    if base.grad_fn is not None:  # an op's output, as most saved activations are: no weight
        return False
    return (base.is_leaf and base.requires_grad) or isinstance(base, torch.nn.Parameter)


def resident_tensors(model: torch.nn.Module) -> list:
    """A model's parameters and buffers: pass as `keep` so that no view of them is offloaded."""
    return list(model.parameters()) + list(model.buffers())


def _storage_of(t: torch.Tensor):
    """The storage holding t's data: a DTensor's is its local shard's (the DTensor wrapper has no
    storage of its own)."""
    return (t._local_tensor if _is_dtensor(t) else t).untyped_storage()


def kept_storages(keep: Iterable[torch.Tensor]) -> dict:
    """Storage identity (the StorageImpl address) -> weak reference, for the tensors in `keep`.

    Keyed by identity, not data pointer: FSDP2 frees and re-allocates a parameter's data in place
    (storage resize_), which changes the pointer, not the storage; and a freed pointer is soon
    reused by an activation, which would then wrongly stay on the device. The weak references keep
    each address from being reused by another storage while we compare against it, without keeping
    any data alive (the original parameters that fully_shard replaces must be freed)."""
    refs = {}
    for t in keep:
        ref = StorageWeakRef(_storage_of(t))
        refs[ref.cdata] = ref
    return refs


class offload_activations(NotPicklable, torch.autograd.graph.saved_tensors_hooks):
    """Context manager: tensors that autograd saves inside it are offloaded.

    Kept on the device: parameters, leaves that require grad and views of either (so the unsharded
    parameters FSDP2 installs for each forward, recognised as nn.Parameters: FSDP2 frees and
    re-gathers their data itself), tensors sharing storage with a tensor in `keep` (apply() passes
    the model's parameters and buffers; a DTensor counts by its local shard), tensors
    smaller than `min_bytes`. Options: `max_in_flight` (copies in flight before forward blocks),
    `prefetch_depth` (tensors copied back ahead of need in backward), `host_budget_bytes`
    (0 = unlimited) or `node_host_budget_bytes` (shared by the ranks of a node), `disk_dir` (the disk tier: where "disk" writes, where "all" spills),
    `disk_direct_io` (its files bypass the page cache: see OffloadManager), `disk_io_threads` (its IO
    threads, one write in flight each: see OffloadManager),
    `keep_on_device_bytes` (the newest saves, up to that many bytes, stay on the GPU uncopied: see
    OffloadManager), or a ready `manager`. `record_offloaded=True` records the storages offloaded
    (`filter.report()`, `filter.reset_record()`: modules mode's report). `batch_copies=True`:
    the copies of the saves made inside are issued together when the context is left (and every
    16 copies): fewer driver calls per copy, for short contexts such as one module call (modules
    mode enters the hooks once per selected module call).
    Leaving the context after tensors were saved but none offloaded warns once, saying why
    (NothingOffloadedWarning; apply() checks each training step instead: warn_on_exit=False).
    copy.deepcopy gives hooks on a copy of the manager (fresh, same configuration) that keep the
    copies of the `keep` tensors (a deep copy of a model maps them to the copy's weights).
    """

    _pickled_what = "its saved-tensor hooks (offload_activations)"

    def __init__(
        self,
        mode="all",
        *,
        min_bytes: int = ACTIVATIONS_MIN_BYTES,
        max_in_flight: int = MANAGER_DEFAULTS.max_in_flight,
        prefetch_depth: int = 4,
        host_budget_bytes: int = 0,
        node_host_budget_bytes: int = 0,
        manager: Optional[object] = None,
        keep: Iterable[torch.Tensor] = (),
        disk_dir: Optional[str] = None,
        keep_on_device_bytes: int = 0,
        disk_direct_io=False,
        disk_io_threads: int = MANAGER_DEFAULTS.disk_io_threads,
        record_offloaded: bool = False,
        warn_on_exit: bool = True,
        batch_copies: bool = False,
    ):
        self.mode = canonical_mode(mode)
        self.min_bytes = min_bytes
        if manager is None:
            settings = dict(max_in_flight=max_in_flight, prefetch_depth=prefetch_depth,
                            host_budget_bytes=host_budget_bytes, node_host_budget_bytes=node_host_budget_bytes,
                            disk_dir=disk_dir or "", keep_on_device_bytes=keep_on_device_bytes,
                            disk_direct_io=disk_direct_io, disk_io_threads=disk_io_threads)
            manager = OffloadManager(**{**settings, **hooks_mode_settings(self.mode, disk_dir or "")})
        self.manager = manager
        self.warn_on_exit = warn_on_exit
        self.batch_copies = batch_copies
        # For __deepcopy__; weak, as kept_storages' references (FSDP2 must free what it replaces).
        keep = list(keep)
        self._keep = [weakref.ref(t) for t in keep]
        self._record_offloaded = record_offloaded
        manager_id = manager.id()
        min_bytes = self.min_bytes
        # Storages that stay resident whatever views of them autograd saves (model weights, buffers):
        # here for the Python path, in the engine's filter for the others.
        kept = kept_storages(keep)
        # The engine decides for plain tensors (one op call per save; two for a leaf without grad,
        # once Python ruled out a frozen parameter); this Python path takes the rest (tensor
        # subclasses, non-strided tensors, frozen parameters) and every save while layer offloading
        # has weights installed (weight_tokens).
        self.filter = save_filter = SaveFilter(manager, min_bytes, keep, record=record_offloaded)
        filter_id = save_filter.id
        self.counts = counts = StepCounts(engine_counts=save_filter.counts)

        # Saves of one storage region share one copy (the engine's table, saved_regions.py); the
        # engine counts those saves and the filter's kept ones, these counters the Python path's.
        self.counters = SaveCounters(STAT_NAMES)
        self.regions = SavedRegions(manager)
        register_stats_source(manager, self.counters)
        counters = self.counters

        def offload(t: torch.Tensor):
            """Records the save and packs it (counted: saved_tensors too)."""
            save_filter.record(t)
            if SavedRegions.handles(t):
                return SavedView(offload_pack(t, manager_id), t.device)
            # Tensor subclasses and empty tensors: one copy per save.
            source, permutation, expanded_sizes = compact_layout(t.detach())
            nbytes = t.numel() * t.element_size()
            counters.add(saved_tensors=1, offloaded_saves=1, saved_bytes=nbytes, distinct_bytes_saved=nbytes)
            return Packed(offload_save(source, manager_id), t.device, permutation, expanded_sizes)

        def pack_local(t: torch.Tensor):
            """Packed object for an offloaded tensor, or t itself where it stays on the device."""
            if type(t) is not torch.Tensor and _is_dtensor(t):
                if _is_weight(t):
                    return t
                local, spec = split_local(t)
                packed = pack_local(local)
                if isinstance(packed, torch.Tensor):
                    return t  # the shard stays (small, or a weight)
                packed.dtensor_spec = spec
                return packed
            nbytes = t.numel() * t.element_size()
            if (
                t.layout != torch.strided
                or t.is_quantized  # the engine copies dense tensors only
                or t.is_nested
                or _is_weight(t)
                or (kept and t.untyped_storage()._cdata in kept)
            ):
                counts.kept_other += 1
                return t
            if nbytes < min_bytes:
                counts.under_min_bytes += 1
                counts.largest_under_min_bytes = max(counts.largest_under_min_bytes, nbytes)
                return t
            counts.offloaded += 1
            try:
                return offload(t)
            except RuntimeError as error:
                node_budget.name_in_error(error, manager_id)
                raise

        def count_kept(t: torch.Tensor) -> torch.Tensor:
            local = t.to_local() if _is_dtensor(t) else t
            counters.add(saved_tensors=1, kept_saves=1, kept_bytes=local.numel() * local.element_size())
            return t

        def python_pack(t: torch.Tensor):
            token = weight_tokens.pack(t)
            if token is not None:  # a frozen weight of an offloaded layer: fetched again in backward
                return token
            packed = pack_local(t)
            # (offload() counted the others)
            return count_kept(packed) if isinstance(packed, torch.Tensor) else packed

        def on_error(error: BaseException):
            """Raises an error of our pack or unpack op, naming a node host budget (node_budget.py)."""
            try:
                if isinstance(error, RuntimeError):
                    node_budget.name_in_error(error, manager_id)
                raise error
            finally:
                del error  # the traceback holds this frame: no cycle that keeps the graph alive

        def decided(t: torch.Tensor, save, decision):
            """What autograd keeps for t, after the engine's filter answered."""
            if save is not None:
                return SavedView(save, t.device)
            if decision == KEEP:
                return t
            return python_pack(t)

        def leaf(t: torch.Tensor):
            """A plain leaf without grad (or a view of one), as the engine asks: a frozen parameter
            outside `keep` (FSDP2's unsharded ones) stays; anything else (rotary cos / sin) is decided
            by the engine like an op's output."""
            if _is_weight(t):
                counts.kept_other += 1
                return count_kept(t)
            try:
                save, decision = offload_pack_filtered(t, manager_id, filter_id, True)
            except RuntimeError as error:
                on_error(error)
            return decided(t, save, decision)

        def pack(t: torch.Tensor):
            if type(t) is torch.Tensor and not weight_tokens.installed():  # the usual case
                try:
                    save, decision = offload_pack_filtered(t, manager_id, filter_id)
                except RuntimeError as error:
                    on_error(error)
                return leaf(t) if decision == LEAF_WITHOUT_GRAD else decided(t, save, decision)
            return python_pack(t)

        def unpack(packed):
            if type(packed) is SavedView:  # the usual case, tested first
                restored = offload_unpack(packed.save, packed.device, manager_id)
                return restored if packed.dtensor_spec is None else join_local(restored, packed.dtensor_spec)
            if isinstance(packed, torch.Tensor):
                return packed
            if isinstance(packed, weight_tokens.WeightToken):
                return packed.unpack()
            restored = rebuild(offload_restore(packed.handle, packed.device, manager_id), packed)
            return join_local(restored, packed.dtensor_spec)

        # The usual case in C (pyext/save_hooks.cpp: the same decisions, without a Python frame or
        # the generic op binding per save), handing the rest to the functions above.
        c_hooks = load_save_hooks()
        if c_hooks is None:
            super().__init__(pack, unpack)
            self._begin_batch = lambda: offload_batch(manager_id, True)
            self._end_batch = lambda: offload_batch(manager_id, False)
        else:
            hooks = c_hooks.SaveHooks(manager_id, filter_id, min_bytes, weight_tokens.registry(), python_pack,
                                      leaf, unpack, on_error)
            super().__init__(hooks.pack, hooks.unpack)
            self._begin_batch, self._end_batch = hooks.begin_batch, hooks.end_batch

    def __deepcopy__(self, memo):
        """Hooks like these for a copy of the model: the pack/unpack closures hold the manager id
        and the kept storages, so they are built again, not copied."""
        keep = [copy.deepcopy(t, memo) for t in (ref() for ref in self._keep) if t is not None]
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        offload_activations.__init__(new, self.mode, min_bytes=self.min_bytes,
                                     manager=copy.deepcopy(self.manager, memo), keep=keep,
                                     record_offloaded=self._record_offloaded,
                                     warn_on_exit=self.warn_on_exit, batch_copies=self.batch_copies)
        return new

    def __enter__(self):
        super().__enter__()
        if self.batch_copies:
            self._begin_batch()
        if self.warn_on_exit:
            self._counts_on_enter = self.counts.snapshot()
        return self

    def __exit__(self, *exc_info):
        super().__exit__(*exc_info)
        if self.batch_copies:
            self._end_batch()  # after the hooks are popped: an error here leaves none installed
        if self.warn_on_exit and exc_info[0] is None:
            self.counts.warn_if_nothing_offloaded(self._counts_on_enter, self.min_bytes)

    def stats(self) -> dict:
        """The manager's statistics (copies, bytes each way, waits) and, merged in, the hooks'
        counters of every hook set on that manager (see manager.stats)."""
        return manager_stats(self.manager)

    def reset_stats(self) -> None:
        manager_reset_stats(self.manager)
