"""The Python side of the save hooks' deduplicated saves. The table itself is the engine's
(csrc/saved_regions.h, through the ops offload_pack / offload_unpack): each distinct region of a
storage that autograd saves is copied to host memory once, however many times it, or views of it,
are saved, and restored once per backward; keyed on the storage object (held through a weak
reference, so its address cannot be reused), shared only within one view family at one version,
version-checked at restore. Here: what autograd keeps for such a save (SavedView), the layout helpers
of the per-save path (tensor subclasses, and the compiled partitioner), and the Python-side counters.
"""
import threading

import torch

from ._library import load_save_hooks


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
    expanded_sizes = tuple(t.shape) if any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape)) else None
    t = compact_with(t, None, expanded_sizes)
    permutation = None if t.is_contiguous() else dense_permutation(t)
    return compact_with(t, permutation, None), permutation, expanded_sizes


_recipes = {}  # (sizes, strides) -> compact_recipe's answer: a model saves the same few layouts every step


def compact_recipe(t: torch.Tensor):
    """compact_layout's (permutation, expanded_sizes) for t's sizes and strides, and whether
    rebuild_layout gives those strides back exactly; worked out once per layout, on meta tensors."""
    key = (t.shape, t.stride())
    recipe = _recipes.get(key)
    if recipe is None:
        source, permutation, expanded_sizes = compact_layout(torch.empty_strided(t.shape, t.stride(), device="meta"))
        rebuilt = rebuild_layout(torch.empty(source.shape, device="meta"), permutation, expanded_sizes)
        recipe = (permutation, expanded_sizes, (rebuilt.shape, rebuilt.stride()) == key)
        if len(_recipes) >= 4096:  # bounded: shapes that change every step (varying lengths)
            _recipes.clear()
        _recipes[key] = recipe
    return recipe


def compact_with(t: torch.Tensor, permutation, expanded_sizes) -> torch.Tensor:
    """compact_layout's tensor, from t's recipe (compact_recipe): broadcast dimensions narrowed to
    one element, then the permutation applied."""
    if expanded_sizes is not None:
        for dim, (s, n) in enumerate(zip(t.stride(), t.shape)):
            if s == 0 and n > 1:
                t = t.narrow(dim, 0, 1)
    return t.permute(permutation) if permutation is not None else t


def rebuild_layout(restored: torch.Tensor, permutation, expanded_sizes) -> torch.Tensor:
    if permutation is not None:
        restored = restored.permute(inverse_permutation(permutation))
    if expanded_sizes is not None:
        restored = restored.expand(expanded_sizes)
    return restored


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
