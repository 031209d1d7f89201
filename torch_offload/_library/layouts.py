"""How a tensor of any layout is copied compact and rebuilt with its own sizes and strides.

The engine copies contiguous tensors. A saved view that is not contiguous is copied through the
layout that holds exactly its data: broadcast (stride-0) dimensions narrowed to one element, a dense
permuted layout (a transpose, an SDPA output) through the permutation that makes it contiguous; the
restore applies the inverse, so the tensor comes back with its original strides. Used where saves
are copied one by one: the save hooks' per-save path (tensor subclasses), selective offload's store
and the compiled graphs' partitioner.
"""
import torch


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


class Packed:
    """What autograd keeps for a tensor copied on its own: the host handle, the device to restore to,
    how to rebuild the original view (same sizes and strides) from the compact copy, and for a
    DTensor its mesh, placements and global shape (only the local shard is copied)."""

    __slots__ = ("handle", "device", "permutation", "expanded_sizes", "dtensor_spec")

    def __init__(self, handle, device, permutation, expanded_sizes, dtensor_spec=None):
        self.handle = handle
        self.device = device
        self.permutation = permutation
        self.expanded_sizes = expanded_sizes
        self.dtensor_spec = dtensor_spec


def rebuild(restored: torch.Tensor, packed: Packed) -> torch.Tensor:
    """The restored compact copy with the layout of the tensor `packed` was made from."""
    return rebuild_layout(restored, packed.permutation, packed.expanded_sizes)
