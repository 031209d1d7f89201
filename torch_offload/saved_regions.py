"""Deduplicated saves for the offload hooks: each distinct region of a storage that autograd saves
is copied to host memory once, however many times it, or views of it, are saved.

Keying on a raw data_ptr has given peers wrong gradients (a tensor and its transpose share a
pointer, and a freed pointer is handed to the next allocation). Here:
- The key is the storage object (its StorageImpl), held through a weak reference for as long as a
  copy of it lives: the StorageImpl cannot be freed, nor its address reused, while we hold it.
- A copy is shared only by saves of one view family (the same `_base`, hence the same version
  counter) at the same version. The engine checks that counter when the copy is restored, so an
  in-place change between a save and backward is an error as in autograd; a change between two
  saves makes the second save copy again.
- A copy holds a byte range of the storage. Each save keeps its own dtype, sizes, strides and
  offset and is rebuilt on the restored storage, restored once per backward.
- Host memory is freed when the last save using a copy is released (autograd drops what we packed).

Which bytes are copied: the range from the view's first to its last element, widened to the union
with overlapping copies of the same family (so a later view inside the union reuses it), and to the
whole storage when that range is at least half of it (so the slices of a fused projection share one
copy; at most 2x the range). A sparse view (its elements under half its range, x[:, ::4]) is
copied alone, compacted; only a save of the identical view reuses it.
"""
import threading
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ._ops import offload_restore, offload_save

_ALIGN = 16  # copy ranges start on a multiple of every element size, so any dtype can be rebuilt


def dense_permutation(t: torch.Tensor):
    """The dimension order in which a non-contiguous `t` is contiguous (a transpose, an SDPA
    output), or None when no order is (overlapping or gapped strides)."""
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.shape[d]))
    return order if t.permute(order).is_contiguous() else None


def inverse_permutation(order) -> list:
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return inverse


def compact_layout(t: torch.Tensor):
    """A contiguous tensor holding exactly t's data, and how to get t's layout back.

    Broadcast (stride-0) dimensions are narrowed to one element so they are copied once; a dense
    permuted layout (a transpose) is saved through the permutation that makes it contiguous, so the
    restored tensor has the original strides. Anything else is copied contiguous."""
    expanded_sizes = None
    if any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape)):
        expanded_sizes = tuple(t.shape)
        for dim, (s, n) in enumerate(zip(t.stride(), t.shape)):
            if s == 0 and n > 1:
                t = t.narrow(dim, 0, 1)
    permutation = None
    if not t.is_contiguous():
        permutation = dense_permutation(t)
        if permutation is not None:
            t = t.permute(permutation)
    return t, permutation, expanded_sizes


def rebuild_layout(restored: torch.Tensor, permutation, expanded_sizes) -> torch.Tensor:
    if permutation is not None:
        restored = restored.permute(inverse_permutation(permutation))
    if expanded_sizes is not None:
        restored = restored.expand(expanded_sizes)
    return restored


def _element_runs(t: torch.Tensor) -> list:
    """The byte intervals [start, end) of storage that t's elements occupy, sorted and merged.
    One interval for a dense view (any permutation); one per row of a sliced view."""
    es = t.element_size()
    dims = sorted(((s * es, n) for n, s in zip(t.shape, t.stride()) if n > 1 and s != 0))
    run = es
    while dims and dims[0][0] == run:
        run *= dims.pop(0)[1]
    start = t.storage_offset() * es
    if not dims:
        return [(start, start + run)]
    starts = torch.tensor([start], dtype=torch.int64)
    for stride, n in dims:
        starts = (starts[:, None] + torch.arange(n, dtype=torch.int64) * stride).flatten()
    return _merged([(s, s + run) for s in starts.tolist()])


def _merged(intervals: list) -> list:
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _total(intervals: list) -> int:
    return sum(end - start for start, end in intervals)


class SaveCounters:
    """Python-side statistics of the offload hooks, since the last reset (see manager.stats)."""

    FIELDS = ("saved_tensors", "offloaded_saves", "shared_saves", "saved_bytes",
              "distinct_bytes_saved", "kept_saves", "kept_bytes")

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._values = dict.fromkeys(self.FIELDS, 0)

    def add(self, **amounts) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._values)


class RegionCopy:
    """One host copy of a storage region: a byte range [lo, hi) of the storage (`compact` None),
    or one sparse view compacted (`compact` = (layout key, permutation, expanded sizes))."""

    __slots__ = ("handle", "device", "lo", "hi", "version", "root_ref", "compact", "saves", "_restored",
                 "_restored_task", "_unpacked", "_lock", "__weakref__")

    def __init__(self, handle, device, lo, hi, version, root, compact=None):
        self.handle = handle
        self.device = device
        self.lo, self.hi = lo, hi
        self.version = version
        self.root_ref = weakref.ref(root)
        self.compact = compact
        self.saves = 0  # SharedSaves made from this copy
        self._restored = None  # the device copy, shared by this backward's unpacks
        self._restored_task = -1
        self._unpacked = 0  # unpacks served in _restored_task
        self._lock = threading.Lock()

    def serves(self, root, version, lo, hi, layout_key) -> bool:
        if self.version != version or self.root_ref() is not root:
            return False
        if self.compact is not None:
            return self.compact[0] == layout_key
        return self.lo <= lo and hi <= self.hi

    def restore(self, manager_id: int) -> torch.Tensor:
        """The device copy. Restored once per backward (the engine checks the version counter
        then); later unpacks in the same backward reuse it, after the same check. The cache holds
        the device copy only until every save made from this copy has been unpacked: backward
        frees each activation after its last use, and so must we."""
        task = torch._C._current_graph_task_id()
        with self._lock:
            if self._restored is not None and task != -1 and task == self._restored_task:
                self._check_unmodified()
                restored = self._restored
                self._unpacked += 1
            else:
                restored = offload_restore(self.handle, self.device, manager_id)
                if task == -1:
                    return restored
                if self._restored_task != task:  # first unpack of this backward
                    torch.autograd.Variable._execution_engine.queue_callback(self._forget)
                self._restored, self._restored_task, self._unpacked = restored, task, 1
            if self._unpacked >= self.saves:  # the last save of this copy: hold nothing more
                self._restored = None
            return restored

    def _forget(self) -> None:
        with self._lock:
            self._restored, self._restored_task, self._unpacked = None, -1, 0

    def _check_unmodified(self) -> None:
        root = self.root_ref()
        if root is not None and root._version != self.version:
            raise RuntimeError(
                "torch_offload: a tensor saved for backward was modified in place after it was "
                f"saved (its version went from {self.version} to {root._version}), so the "
                "offloaded copy is stale. Save it after the in-place operation, or clone it "
                "before modifying it.")


class SharedSave:
    """What autograd keeps for one save: the copy holding its data and its own view geometry
    (offset in elements from the copy's start), plus a DTensor's spec when it is a local shard."""

    __slots__ = ("region", "dtype", "size", "stride", "offset", "dtensor_spec")

    def __init__(self, region: RegionCopy, t: torch.Tensor):
        self.region = region
        self.dtype, self.size, self.stride = t.dtype, tuple(t.shape), t.stride()
        self.offset = (t.storage_offset() * t.element_size() - region.lo) // t.element_size()
        self.dtensor_spec = None

    def unpack(self, manager_id: int) -> torch.Tensor:
        restored = self.region.restore(manager_id)
        if self.region.compact is not None:
            _, permutation, expanded_sizes = self.region.compact
            return rebuild_layout(restored, permutation, expanded_sizes)
        if (self.offset == 0 and restored.dtype == self.dtype and restored.stride() == self.stride
                and tuple(restored.shape) == self.size):
            return restored  # the copy was made from this very layout (the usual case)
        view = torch.empty(0, dtype=self.dtype, device=restored.device)
        return view.set_(restored.untyped_storage(), self.offset, self.size, self.stride)


class _StorageEntry:
    """The live copies of one storage and the byte intervals its offloaded saves cover."""

    __slots__ = ("storage_ref", "nbytes", "copies", "covered")

    def __init__(self, storage_ref: StorageWeakRef, nbytes: int):
        self.storage_ref = storage_ref  # pins the StorageImpl's address while the entry lives
        self.nbytes = nbytes
        self.copies = []  # weakrefs to RegionCopy
        self.covered = []  # merged byte intervals of the elements saved so far


class SavedRegions:
    """The table of live copies for one set of hooks; pack() returns a SharedSave."""

    def __init__(self, manager_id: int, counters: SaveCounters):
        self._manager_id = manager_id
        self._counters = counters
        self._lock = threading.RLock()  # re-entered if a copy dies (weakref callback) meanwhile
        self._storages = {}  # StorageImpl address -> _StorageEntry

    @staticmethod
    def handles(t: torch.Tensor) -> bool:
        """Plain dense tensors with data; anything else keeps the per-save path."""
        return type(t) is torch.Tensor and t.numel() > 0 and not (t.is_conj() or t.is_neg())

    def pack(self, t: torch.Tensor) -> SharedSave:
        # On the host's hot path (every offloaded save): the common case, a dense tensor, takes
        # no layout key, no element-run walk and no weak reference unless a copy is made.
        storage = t.untyped_storage()
        key = storage._cdata  # the StorageImpl's address, as StorageWeakRef.cdata
        root = t._base if t._base is not None else t
        version, es = t._version, t.element_size()
        lo = t.storage_offset() * es
        dense = t.is_contiguous()
        if dense:
            hi = lo + t.numel() * es
            runs = [(lo, hi)]
        else:
            hi = lo + (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * es
            runs = None
        layout_key = (t.dtype, tuple(t.shape), t.stride(), t.storage_offset())
        with self._lock:
            entry = self._storages.get(key)
            live = [c for c in (ref() for ref in entry.copies) if c is not None] if entry else []
        region = next((c for c in live if c.serves(root, version, lo, hi, layout_key)), None)
        reused = region is not None
        if not reused:
            region = self._copy(t, storage.nbytes(), root, version, lo, hi, layout_key, live)
        if runs is None:
            runs = _element_runs(t)
        with self._lock:
            entry = self._storages.get(key)
            if entry is None:
                entry = self._storages[key] = _StorageEntry(StorageWeakRef(storage), storage.nbytes())
            if not any(ref() is region for ref in entry.copies):
                entry.copies.append(weakref.ref(region, self._evict_callback(key)))
            region.saves += 1
            if entry.covered:
                before = _total(entry.covered)
                entry.covered = _merged(entry.covered + runs)
                distinct = _total(entry.covered) - before
            else:
                entry.covered, distinct = _merged(runs), _total(runs)
        self._counters.add(saved_tensors=1, offloaded_saves=1, shared_saves=int(reused),
                           saved_bytes=t.numel() * es, distinct_bytes_saved=distinct)
        return SharedSave(region, t)

    def _copy(self, t, storage_nbytes, root, version, lo, hi, layout_key, live) -> RegionCopy:
        es = t.element_size()
        distinct_elements = 1
        for n, s in zip(t.shape, t.stride()):
            distinct_elements *= n if s != 0 else 1
        if 2 * distinct_elements * es < hi - lo:  # sparse: copy its elements only
            source, permutation, expanded_sizes = compact_layout(t.detach())
            handle = offload_save(source, self._manager_id)
            return RegionCopy(handle, t.device, lo, lo, version, root,
                              compact=(layout_key, permutation, expanded_sizes))
        for c in live:  # widen to the union with the family's overlapping copies
            if c.compact is None and c.version == version and c.root_ref() is root \
                    and c.lo < hi and lo < c.hi:
                lo, hi = min(lo, c.lo), max(hi, c.hi)
        if 2 * (hi - lo) >= storage_nbytes:
            lo, hi = 0, storage_nbytes
        # Bytes through a 1-D view of t's family (same version counter, so the engine checks it),
        # in t's dtype: the range is clamped to what t's element size can address.
        if lo == 0 and hi == storage_nbytes and t.is_contiguous():
            # The whole storage, as t itself: the engine copies its bytes (the usual case).
            return RegionCopy(offload_save(t.detach(), self._manager_id), t.device, lo, hi, version, root)
        addressable = storage_nbytes // es * es
        lo = lo // _ALIGN * _ALIGN
        hi = min(-(-hi // _ALIGN) * _ALIGN, addressable)
        flat = torch.as_strided(t.detach(), ((hi - lo) // es,), (1,), lo // es)
        source = flat.view(torch.uint8) if es > 1 else flat
        return RegionCopy(offload_save(source, self._manager_id), t.device, lo, hi, version, root)

    def _evict_callback(self, key):
        table = weakref.ref(self)

        def evict(dead_ref):
            regions = table()
            if regions is None:
                return
            with regions._lock:
                entry = regions._storages.get(key)
                if entry is None:
                    return
                entry.copies = [ref for ref in entry.copies if ref is not dead_ref]
                if not entry.copies:
                    del regions._storages[key]

        return evict

    def live_storages(self) -> int:
        with self._lock:
            return len(self._storages)
