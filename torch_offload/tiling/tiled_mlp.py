"""tile_mlp(model): each decoder layer's MLP computed over tiles of the sequence (sequence_tiles.py),
in the forward, in a checkpoint's recompute and in backward.

The MLP modules are found by the "mlp" module preset (targets/presets.py: mlp, feed_forward, ffn, ...)
inside the blocks (default: the decoder layers), or given. Each gets a forward wrapper: its input's
sequence dimension (the one before the features) is cut into tiles whose intermediates take no more
memory than the larger of the input itself and a sixteenth of the device memory left (default_tile_tokens;
`tile_tokens=` fixes it), decided once per sequence length so that a forward and its recompute tile
alike; a length whose intermediates fit that budget whole runs untiled. An MLP called with more than its
input, or returning anything but one tensor (a mixture of experts' router logits), runs untiled.
Any other position-wise module can be given as mlps=[...]: a norm (find_norms), whose float32 upcast
saves two copies of its input's size in float32, tiles the same way.
"""
from typing import Iterable, List, Optional

import torch
from torch import nn

from ..blocks import ForwardWrapper, find_blocks
from ..undo import UndoStack
from ..targets.presets import preset_modules
from .sequence_tiles import default_tile_tokens, tiled_module_call

# A tile's intermediates may take this share of the device memory left when a length is first seen
# (or the MLP input's size, where that is more): the first forward of a length runs with far more
# memory free than backward's peak, which adds a whole block's recompute and its gradients.
MEMORY_LEFT_SHARE = 16


def device_memory_left(device: torch.device) -> int:
    """Bytes the caching allocator could still hand out on `device`: free in the driver plus cached
    and unused; 0 on CPU, whose tiles are sized by the input alone."""
    if device.type != "cuda":
        return 0
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)

def _intermediate(module: nn.Module) -> Optional[int]:
    """The widest output of the module's Linear modules (an MLP's intermediate size); None for a
    module without any (a norm), whose widest intermediates are float32 copies of its input."""
    widths = [m.out_features for m in module.modules() if isinstance(m, nn.Linear)]
    return max(widths) if widths else None


def find_norms(blocks: Iterable[nn.Module]) -> List[nn.Module]:
    """The norms that are direct children of each block (a decoder layer's input and post-attention
    RMSNorm or LayerNorm): position-wise modules whose float32 upcast makes their saved tensors
    twice the size of their input."""
    return [child for block in blocks for child in block.children()
            if isinstance(child, (nn.LayerNorm, nn.RMSNorm)) or type(child).__name__.endswith(("RMSNorm", "LayerNorm"))]


class TiledForward(ForwardWrapper):
    """A position-wise module's forward (an MLP's, a norm's) over tiles of the sequence while its
    input has more tokens than a tile."""

    _pickled_what = "the tiled forward of a position-wise module"

    def __init__(self, mlp: nn.Module, tile_tokens: Optional[int]):
        super().__init__(mlp)
        self.tile_tokens = tile_tokens
        self.intermediate = _intermediate(mlp)
        self.tiles = {}  # sequence length -> tokens per tile, decided at its first call

    def __call__(self, x, *args, **kwargs):
        if args or kwargs or not isinstance(x, torch.Tensor) or x.dim() < 2:
            return self.run(x, *args, **kwargs)
        tokens = x.shape[-2]
        tile = self.tile_tokens or self.tiles.get(tokens)
        if tile is None:
            budget = max(x.numel() * x.element_size(), device_memory_left(x.device) // MEMORY_LEFT_SHARE)
            # An MLP's gate, up and their product in x's dtype; a norm's float32 copies of x.
            width, size = (self.intermediate, x.element_size()) if self.intermediate else (x.shape[-1], 4)
            tile = self.tiles[tokens] = default_tile_tokens(tokens, x.shape[-1], width, budget, element_size=size)
        return tiled_module_call(self._run_one, self.block, x, tile, dim=-2)

    def _run_one(self, x):
        out = self.run(x)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"torch_offload.tile_mlp: {type(self.block).__name__} returned {type(out).__name__}, "
                            "not one tensor; only position-wise modules that return their output alone can be "
                            "tiled (leave it out with mlps=[...])")
        return out


class TiledMLPHandle(UndoStack):
    """What tile_mlp() returns: the tiled modules (`mlps`) and remove()."""

    _pickled_what = "its TiledMLPHandle"

    def __init__(self, wrappers: List[TiledForward]):
        super().__init__()
        self._wrappers = wrappers
        self.push(self._wrappers.clear)  # undone last: mlps lists nothing once removed
        for wrapper in wrappers:
            self.replace_forward(wrapper.block, wrapper)

    @property
    def mlps(self) -> List[nn.Module]:
        return [wrapper.block for wrapper in self._wrappers]

    def tiles(self) -> dict:
        """{sequence length: tokens per tile} as decided so far (the first MLP's, which all share
        where the default sizes them: they see the same input size and memory)."""
        return dict(self._wrappers[0].tiles) if self._wrappers else {}


def find_mlps(model: nn.Module, blocks: Optional[Iterable[nn.Module]] = None) -> List[nn.Module]:
    """The MLP module of each block (the "mlp" preset: mlp, feed_forward, ffn, block_sparse_moe)."""
    blocks = list(blocks) if blocks is not None else find_blocks(model)
    mlps = []
    for block in blocks:
        found = preset_modules(block, "mlp").include  # raises when a block has none
        mlps.extend(block.get_submodule(name) for name in found)
    return mlps


def tile_mlp(model: nn.Module, blocks: Optional[Iterable[nn.Module]] = None, *,
             mlps: Optional[Iterable[nn.Module]] = None, tile_tokens: Optional[int] = None) -> TiledMLPHandle:
    """Computes each MLP of `model` over tiles of the sequence (see the module's docstring): no
    tokens x intermediate tensor exists at once, in forward or backward. `blocks`: where to find the
    MLPs (default: the decoder layers); `mlps`: the position-wise modules to tile instead;
    `tile_tokens`: tokens per tile (default: from the sequence length and the memory left, so that a
    tile's intermediates take no more than the MLP's input or a sixteenth of the device memory left,
    whichever is more). Works inside checkpointed blocks (every
    mode of apply), with PEFT adapters on the projections and with layer offloading (each tile's
    backward computes with the weights of its forward, saved like any op's). Returns a handle whose
    remove() undoes it."""
    if tile_tokens is not None and (not isinstance(tile_tokens, int) or tile_tokens < 1):
        raise ValueError(f"torch_offload.tile_mlp: tile_tokens={tile_tokens!r}; expected an int >= 1")
    blocks = list(blocks) if blocks is not None else (find_blocks(model) if mlps is None else None)
    modules = list(mlps) if mlps is not None else find_mlps(model, blocks)
    if not modules:
        raise ValueError("torch_offload.tile_mlp: no MLP to tile (mlps is empty)")
    if any(isinstance(m.__dict__.get("forward"), TiledForward) for m in modules):
        raise ValueError("torch_offload.tile_mlp: an MLP is tiled already; call remove() first")
    return TiledMLPHandle([TiledForward(mlp, tile_tokens) for mlp in modules])
