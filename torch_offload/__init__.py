"""torch_offload: activation offloading for PyTorch training, backed by a C++ engine.

Ops: torch.ops.offload.offload_save / offload_restore; class: torch.classes.offload.OffloadManager.
"""
from ._library import load_library
from ._ops import offload_restore, offload_save
from .activations import offload_activations
from .apply import OffloadHandle, apply
from .blocks import find_blocks
from .checkpoint import checkpoint
from .compile import OffloadPartitioner, compile
from .layers import LayerOffloadHandle, offload_layers
from .manager import OffloadManager, default_manager, reset_stats, stats
from .modules import ModuleOffloadHandle, offload_modules, select_modules

library_path = load_library()

__all__ = [
    "LayerOffloadHandle",
    "ModuleOffloadHandle",
    "OffloadHandle",
    "OffloadManager",
    "apply",
    "checkpoint",
    "compile",
    "OffloadPartitioner",
    "default_manager",
    "find_blocks",
    "library_path",
    "offload_activations",
    "offload_layers",
    "offload_modules",
    "offload_restore",
    "offload_save",
    "reset_stats",
    "select_modules",
    "stats",
]
