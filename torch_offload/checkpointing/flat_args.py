"""Flattening a call's arguments (and a block's outputs) into leaves and back, on the host's hot path.

Each checkpointed block flattens its arguments in forward and rebuilds them in the recompute. torch's
pytree handles any registered container but costs tens of microseconds per call on a slow host,
several times per block; where a step is bound by the host (short sequences) that is a visible share. The containers a
block is called with are tuples, lists, dicts and namedtuples (a Hugging Face decoder layer gets
position_embeddings=(cos, sin)): those are walked here directly. A structure holding any other
container that pytree knows (OrderedDict, a registered dataclass, ...) goes through pytree, so that
no tensor inside one is missed.
"""
import torch
from torch.utils import _pytree as pytree

_TENSOR = object()  # marks where a tensor stood among a template's leaves

class _NotPlain(Exception):
    """A container pytree knows and _walk does not."""


def _walk(value, leaves: list):
    """Appends the leaves of `value`; returns its spec (None for a leaf)."""
    kind = type(value)
    if kind is dict:
        return (dict, list(value), [_walk(v, leaves) for v in value.values()])
    if kind is tuple or kind is list or (isinstance(value, tuple) and hasattr(kind, "_fields")):
        return (kind, None, [_walk(v, leaves) for v in value])
    if kind in pytree.SUPPORTED_NODES:
        raise _NotPlain
    leaves.append(value)
    return None


def _build(spec, it):
    if spec is None:
        return next(it)
    kind, keys, children = spec
    values = [_build(child, it) for child in children]
    if kind is dict:
        return dict(zip(keys, values))
    if kind in (tuple, list):
        return kind(values)
    return kind(*values)  # a namedtuple


def flatten(value):
    """(leaves, spec) of `value`: unflatten(leaves, spec) rebuilds it."""
    leaves = []
    try:
        return leaves, ("plain", _walk(value, leaves))
    except _NotPlain:
        leaves, spec = pytree.tree_flatten(value)
        return leaves, ("pytree", spec)


def unflatten(leaves, spec):
    how, inner = spec
    if how == "plain":
        return _build(inner, iter(leaves))
    return pytree.tree_unflatten(leaves, inner)


def split_tensors(value):
    """(tensors, template): the tensors among `value`'s leaves, in order, and what with_tensors()
    rebuilds `value` from, around other tensors in their places."""
    leaves, spec = flatten(value)
    tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
    return tensors, ([_TENSOR if isinstance(v, torch.Tensor) else v for v in leaves], spec)


def with_tensors(template, tensors):
    """The value split_tensors() split into `template`, with `tensors` in its tensors' places."""
    leaves, spec = template
    it = iter(tensors)
    return unflatten([next(it) if v is _TENSOR else v for v in leaves], spec)
