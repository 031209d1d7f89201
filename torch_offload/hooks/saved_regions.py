"""The Python side of the save hooks' deduplicated saves. The table itself is the engine's
(csrc/saved_regions.h, through the ops offload_pack / offload_unpack): each distinct region of a
storage that autograd saves is copied to host memory once, however many times it, or views of it,
are saved, and restored once per backward; keyed on the storage object (held through a weak
reference, so its address cannot be reused), shared only within one view family at one version,
version-checked at restore. Here: what autograd keeps for such a save (SavedView), and the Python-side counters.
"""
import threading

import torch

from .._library.loading import load_save_hooks


class SaveCounters:
    """Python-side statistics of the offload hooks, since the last reset (see manager.stats): what
    the hooks' Python path saved, added to the engine's statistics of the same names (saved_tensors,
    offloaded_saves, kept_bytes, ...). `names`: the engine's statistics (manager.STAT_NAMES), the
    only names add() takes. snapshot() holds the names counted since the reset."""

    def __init__(self, names):
        self._names = tuple(names)
        self._known = frozenset(self._names)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._values = {}

    def add(self, **amounts) -> None:
        with self._lock:
            for name, amount in amounts.items():
                if name not in self._known:
                    raise KeyError(f"SaveCounters.add: {name!r} is none of the engine's statistics "
                                   f"({', '.join(self._names)})")
                self._values[name] = self._values.get(name, 0) + amount

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._values)


class _PythonSavedView:
    """What autograd keeps for one offloaded save: its save handle (a host tensor with the save's
    dtype, sizes and strides on the storage of the copy holding its elements), its device, and a
    DTensor's spec when it is a local shard. The C save hooks' own type where they are built."""

    __slots__ = ("save", "device", "dtensor_spec")

    def __init__(self, save: torch.Tensor, device: torch.device):
        self.save, self.device, self.dtensor_spec = save, device, None


_c_hooks = load_save_hooks()
SavedView = _c_hooks.SavedView if _c_hooks is not None else _PythonSavedView


class SavedRegions:
    """The manager's table of copies (csrc/saved_regions.h), seen from one set of hooks: which
    tensors it takes, and its counts for tests and diagnostics."""

    def __init__(self, manager):
        self._manager = manager

    @staticmethod
    def handles(t: torch.Tensor) -> bool:
        """Plain dense tensors with data; anything else keeps the per-save path."""
        return type(t) is torch.Tensor and t.numel() > 0 and not (t.is_conj() or t.is_neg())

    def live_storages(self) -> int:
        """Source storages with a live copy."""
        return self._manager.saved_region_counts()["storages"]

    def held_restores(self) -> int:
        """Copies holding a restored device tensor now."""
        return self._manager.saved_region_counts()["held_restores"]
