"""torch_offload: activation offloading for PyTorch training, backed by a C++ engine.

Ops: torch.ops.offload.offload_save / offload_restore (and offload_pack / offload_pack_filtered /
offload_unpack, the save hooks' filtered, deduplicated saves); class: torch.classes.offload.OffloadManager.
"""
from ._library import load_library
from ._ops import offload_restore, offload_save
from .activations import offload_activations
from .apply import OffloadHandle, apply
from .blocks import find_blocks
from .checkpoint import checkpoint
from .chunked_loss import chunked_causal_lm_loss
from .compile import OffloadPartitioner, compile
from .empty_steps import NothingOffloadedWarning
from .hf_causal_mask import sdpa_is_causal
from .hf_logits import detach_logits
from .layers import LayerOffloadHandle, offload_layers
from .lm_loss import ChunkedLossHandle, chunk_lm_loss
from .manager import OffloadManager, default_manager, reset_stats, stats
from .modules import ModuleOffloadHandle, offload_modules, select_modules
from .node_budget import gather_stats
from .selective import selective_offload_contexts
from .selective import checkpoint as selective_checkpoint

library_path = load_library()


def __getattr__(name):
    # torch_offload.integrations imports transformers: loaded on first use, not with the package.
    if name == "integrations":
        import importlib

        return importlib.import_module(".integrations", __name__)
    raise AttributeError(f"module 'torch_offload' has no attribute {name!r}")


__all__ = [
    "ChunkedLossHandle",
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
]
