"""torch_offload: activation offloading for PyTorch training, backed by a C++ engine.

Ops: torch.ops.offload.offload_save / offload_restore (and offload_pack / offload_pack_filtered /
offload_unpack, the save hooks' filtered, deduplicated saves); class: torch.classes.offload.OffloadManager.
"""
from ._library.loading import load_library
from ._library.ops import offload_restore, offload_save
from .handle import OffloadHandle
from .hooks.offload_hooks import offload_activations
from .apply import apply
from .config import (ActivationsOptions, AutoOptions, ChunkedLossOptions, DiskOptions, HiddenStatesOptions,
                     LayerOffloadingOptions, LongContextOptions, ModulesOptions, OffloadConfig, SelectiveOptions,
                     SyncOptions, TilingOptions)
from .blocks import find_blocks
from .checkpointing.checkpoint import checkpoint
from .loss.chunked_loss import chunked_causal_lm_loss
from .compiler.compile_model import OffloadPartitioner, compile
from .hooks.nothing_offloaded import NothingOffloadedWarning
from .compiler.hf_causal_mask import sdpa_is_causal
from .compiler.hf_logits import detach_logits
from .layers.frozen_weights import LayerOffloadHandle, offload_layers
from .loss.lm_loss import ChunkedLossHandle, chunk_lm_loss
from ._library.manager import OffloadManager, default_manager, reset_stats, stats
from .targets.module_offload import ModuleOffloadHandle, offload_modules
from .targets.selection import select_modules
from .tiling.sequence_tiles import tiled_compute
from .tiling.tiled_mlp import TiledMLPHandle, tile_mlp
from ._library.node_budget import gather_stats
from .modes.selective import selective_checkpoint
from .policies.per_op import selective_offload_contexts

library_path = load_library()


def __getattr__(name):
    # torch_offload.integrations imports transformers: loaded on first use, not with the package.
    if name == "integrations":
        import importlib

        return importlib.import_module(".integrations", __name__)
    raise AttributeError(f"module 'torch_offload' has no attribute {name!r}")


__all__ = [
    "ActivationsOptions",
    "AutoOptions",
    "ChunkedLossHandle",
    "ChunkedLossOptions",
    "DiskOptions",
    "HiddenStatesOptions",
    "LayerOffloadingOptions",
    "LongContextOptions",
    "ModulesOptions",
    "OffloadConfig",
    "SelectiveOptions",
    "SyncOptions",
    "TilingOptions",
    "LayerOffloadHandle",
    "ModuleOffloadHandle",
    "NothingOffloadedWarning",
    "OffloadHandle",
    "OffloadManager",
    "apply",
    "checkpoint",
    "chunk_lm_loss",
    "chunked_causal_lm_loss",
    "compile",
    "OffloadPartitioner",
    "default_manager",
    "find_blocks",
    "gather_stats",
    "library_path",
    "offload_activations",
    "offload_layers",
    "offload_modules",
    "offload_restore",
    "offload_save",
    "reset_stats",
    "sdpa_is_causal",
    "detach_logits",
    "select_modules",
    "selective_checkpoint",
    "selective_offload_contexts",
    "stats",
    "TiledMLPHandle",
    "tile_mlp",
    "tiled_compute",
]
