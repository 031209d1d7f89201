"""The parts of a configuration besides the activation mode: layer offloading, the chunked loss, the
tiled MLP and norms, and long_context (which decides the others where they are not given).

In an OffloadConfig each part is None (not said: long_context decides, else off), False (off) or its
options (on). The keyword values apply() takes for them (True, a number, a dict) become these
classes through from_value()."""
import dataclasses
from typing import Optional

from ..loss.chunked_loss import DEFAULT_CHUNK_TOKENS
from .errors import OptionTypeError, OptionValueError, check_bool, check_int
from .._library.manager import MANAGER_DEFAULTS


def _from_value(cls, name: str, value, example: str, number_field: Optional[str] = None):
    """None, False, an instance of `cls`, True (the defaults), a dict of its fields or, where
    `number_field` is given, an int for it."""
    if value is None or value is False or isinstance(value, cls):
        return value
    if value is True:
        return cls()
    if isinstance(value, dict):
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise OptionTypeError(f"{name}={value!r} has unknown keys {unknown}; expected {' and/or '.join(fields)}")
        return cls(**value)
    if number_field is not None and isinstance(value, int) and not isinstance(value, bool):
        return cls(**{number_field: value})
    raise OptionValueError(f"{name}={value!r}; expected True, False, {example} or {cls.__name__}(...)")


@dataclasses.dataclass(frozen=True)
class LayerOffloadingOptions:
    """layer_offloading: the frozen weights of every block live in host memory and visit the GPU only
    while the block runs (offload_layers).

    max_in_flight: weight copies in flight at once.
    host_budget_bytes / node_host_budget_bytes: the most pinned host memory the weights may take
        (0: what is available), this rank's / the node's.
    keep_layers_that_fit: from the second step at each input size, the layers whose weights fit in
        the GPU memory the first step left keep them on the GPU (long_context=True turns it on).
    """

    max_in_flight: int = MANAGER_DEFAULTS.max_in_flight
    host_budget_bytes: int = 0
    node_host_budget_bytes: int = 0
    keep_layers_that_fit: bool = False

    def __post_init__(self):
        for name in ("max_in_flight", "host_budget_bytes", "node_host_budget_bytes"):
            check_int(name, getattr(self, name))
        check_bool("keep_layers_that_fit", self.keep_layers_that_fit)

    @classmethod
    def from_value(cls, value):
        return _from_value(cls, "layer_offloading", value, "a dict such as {'max_in_flight': 2}")


@dataclasses.dataclass(frozen=True)
class ChunkedLossOptions:
    """chunked_loss: a Hugging Face causal LM trained with labels computes its loss over chunks of
    tokens without materialising the logits (chunk_lm_loss).

    chunk_tokens: tokens per chunk.
    grads_in_forward: the loss's gradients are computed in the forward, as a fused linear
        cross-entropy computes them: the LM head's product over every token runs once, not again in
        backward. One backward per forward; False for retain_graph or a second backward.
    """

    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    grads_in_forward: bool = True

    def __post_init__(self):
        check_int("chunk_tokens", self.chunk_tokens, 1)
        if not isinstance(self.grads_in_forward, bool):  # a ValueError, as chunk_lm_loss raises it
            raise OptionValueError(f"grads_in_forward={self.grads_in_forward!r}; expected True or False")

    @classmethod
    def from_value(cls, value):
        return _from_value(cls, "chunked_loss", value, "a number of tokens per chunk, a dict such as "
                           "{'chunk_tokens': 2048, 'grads_in_forward': True}", "chunk_tokens")


@dataclasses.dataclass(frozen=True)
class TilingOptions:
    """tiling: position-wise modules of the blocks computed over tiles of the sequence (tile_mlp), so
    that no tokens x intermediate tensor exists at once.

    mlp: each block's MLP (the "mlp" module preset).
    norms: the RMSNorm / LayerNorm modules directly in the blocks (their float32 upcast).
    tile_tokens: tokens per tile (None: sized at the first call of each length from the memory left).
    """

    mlp: bool = True
    norms: bool = True
    tile_tokens: Optional[int] = None

    def __post_init__(self):
        check_bool("mlp", self.mlp)
        check_bool("norms", self.norms)
        if self.tile_tokens is not None:
            check_int("tile_tokens", self.tile_tokens, 1)
        if not (self.mlp or self.norms):
            raise OptionValueError("tiling with mlp=False and norms=False tiles nothing; pass tiling=False")

    @classmethod
    def from_value(cls, value):
        return _from_value(cls, "tiling", value, "a dict such as {'tile_tokens': 8192}")


@dataclasses.dataclass(frozen=True)
class LongContextOptions:
    """long_context: for sequences far longer than checkpointing fits, turns on, where they apply and
    unless said otherwise, the chunked loss, the tiled MLP and norms, layer offloading of frozen
    weights, and a host budget from the available host RAM beyond which the boundaries spill to
    disk (resolve.py); handle.explain() says what and why.

    tile_tokens: tokens per tile of the tiling it turns on (None: sized from the memory left).
    """

    tile_tokens: Optional[int] = None

    def __post_init__(self):
        if self.tile_tokens is not None:
            check_int("tile_tokens", self.tile_tokens, 1)

    @classmethod
    def from_value(cls, value):
        return _from_value(cls, "long_context", value, "a dict such as {'tile_tokens': 8192}")
