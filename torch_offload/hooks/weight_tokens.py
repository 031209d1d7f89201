"""Saved tensors that are offloaded frozen weights: autograd keeps a token, not the device copy.

Layer offloading (layers/frozen_weights.py) installs a fresh device copy of a layer's frozen weights while the
layer runs. Autograd saves those weights (and views such as weight.t()) for backward; kept as they
are, every layer's weights would stay on the device until backward. So while a copy is installed
its storage is registered here, and any saved-tensor hook of ours packs a tensor on that storage
into a WeightToken: the weight's source plus the view geometry. Unpacking fetches the weight back
from host memory (prefetched) and rebuilds the view. The weights are frozen, so the fetched copy is
bit-identical to the one that was saved.
"""
import threading
import weakref
from typing import Optional

import torch

_lock = threading.Lock()
_installed = {}  # data_ptr of an installed device copy's storage -> its WeightSource


class WeightSource:
    """One offloaded frozen parameter: fetches its device copy, sharing one live copy between
    tokens. `fetch_copy` does the restore; `on_fetch` lets the layer prefetch what comes next."""

    def __init__(self, dtype: torch.dtype, fetch_copy, on_fetch):
        self.dtype = dtype
        self._fetch_copy = fetch_copy
        self._on_fetch = on_fetch
        self._live = None  # weakref to the device copy last fetched or installed
        self._lock = threading.Lock()

    def remember(self, copy: torch.Tensor) -> None:
        with self._lock:
            self._live = weakref.ref(copy)

    def fetch(self) -> torch.Tensor:
        with self._lock:
            copy = self._live() if self._live is not None else None
            if copy is None:
                self._on_fetch()
                copy = self._fetch_copy()
                self._live = weakref.ref(copy)
            return copy


class WeightToken:
    __slots__ = ("source", "offset", "size", "stride")

    def __init__(self, source: WeightSource, t: torch.Tensor):
        self.source = source
        self.offset = t.storage_offset()
        self.size = tuple(t.shape)
        self.stride = t.stride()

    def unpack(self) -> torch.Tensor:
        return self.source.fetch().as_strided(self.size, self.stride, self.offset)


def install(copy: torch.Tensor, source: WeightSource) -> Optional[int]:
    """Registers `copy`'s storage as `source`'s; returns the key to uninstall it by (None: nothing
    registered, an empty copy)."""
    key = None
    if copy.numel() > 0:
        key = copy.untyped_storage().data_ptr()
        with _lock:
            _installed[key] = source
    source.remember(copy)
    return key


def uninstall(key: Optional[int]) -> None:
    """Removes what install() registered under `key`. By the key, not the copy: a forward that set_()s
    the parameter to other storage must not leave the old address registered, where a later tensor
    allocated there would be packed as this weight."""
    if key is not None:
        with _lock:
            _installed.pop(key, None)


def registry() -> dict:
    """The installed copies (mutated in place, never rebound: the C save hooks hold it and test
    whether it is empty, as installed() does)."""
    return _installed


def installed() -> bool:
    """Whether any weight copy is installed now (layer offloading runs a layer)."""
    return bool(_installed)


def pack(t: torch.Tensor) -> Optional[WeightToken]:
    """A token for `t` if it lies on an installed weight copy, else None."""
    if not _installed or t.layout != torch.strided or type(t) not in (torch.Tensor, torch.nn.Parameter):
        return None
    with _lock:
        source = _installed.get(t.untyped_storage().data_ptr()) if t.numel() > 0 else None
    if source is None or t.dtype != source.dtype:
        return None
    return WeightToken(source, t)


def top_hooks():
    """The (pack, unpack) saved-tensor hooks active now, or None."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


class weight_hooks(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks that turn installed weights into tokens and hand every other tensor to
    the hooks that were active when they were created (a user's save_on_cpu, say), or keep it.
    `outer`: hand them to these (pack, unpack) hooks instead (None: keep them), from top_hooks()."""

    _ACTIVE_NOW = object()

    def __init__(self, outer=_ACTIVE_NOW):
        outer = top_hooks() if outer is weight_hooks._ACTIVE_NOW else outer
        outer_pack, outer_unpack = outer if outer is not None else (None, None)

        def pack_hook(t):
            token = pack(t)
            if token is not None:
                return token
            return (outer_pack(t),) if outer_pack is not None else t

        def unpack_hook(packed):
            if isinstance(packed, WeightToken):
                return packed.unpack()
            if isinstance(packed, tuple):
                return outer_unpack(packed[0])
            return packed

        super().__init__(pack_hook, unpack_hook)
