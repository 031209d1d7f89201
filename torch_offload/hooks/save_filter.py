"""The engine's decision of which saves one set of save hooks offloads (csrc/save_filter.h), seen
from Python: its counts, and its record of the storages offloaded since a reset (modules mode's
report). For a leaf that does not require grad (or a view of one) the engine asks whether it is a
frozen parameter, a Python notion; told it is not, it decides it like any activation (a second op
call, after the decision DECISIONS.leaf_without_grad: the engine's codes, _library/manager.py),
otherwise the hooks keep it. Saves the engine leaves to the hooks (tensor
subclasses such as DTensor, non-strided tensors, frozen parameters) are decided in Python and
recorded in the engine's record too."""
import weakref

import torch

from .._library.dtensors import is_dtensor


class SaveFilter:
    """One filter of `manager` (an OffloadManager): saves under `min_bytes`, and saves of the storages
    of `keep` (a DTensor counts by its local shard), stay on the device; weights too. Removed from
    the manager when this object goes."""

    def __init__(self, manager, min_bytes: int, keep=(), record: bool = False):
        self.id = manager.add_save_filter(min_bytes, record)
        self._manager = manager
        self._record = record
        for t in keep:
            manager.save_filter_keep(self.id, t._local_tensor if is_dtensor(t) else t)
        weakref.finalize(self, manager.remove_save_filter, self.id)

    def counts(self) -> dict:
        """offloaded, under_min_bytes, largest_under_min_bytes, kept_other: the engine's decisions
        so far (never reset)."""
        return self._manager.save_filter_counts(self.id)

    def record(self, t: torch.Tensor) -> None:
        """Records the storage of a save offloaded on the hooks' Python path."""
        if self._record:
            self._manager.save_filter_record(self.id, t)

    def report(self) -> dict:
        """The storages offloaded since the last reset_record: their bytes (expected_bytes), and the
        bytes of those no longer alive (freed_bytes)."""
        return dict(self._manager.save_filter_report(self.id))

    def reset_record(self) -> None:
        self._manager.save_filter_reset_record(self.id)
