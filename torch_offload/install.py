"""install(): a resolved OffloadConfig installed on a model, step by step, in this order:

1. the chunked loss (the model's forward and LM head; not the blocks);
2. layer offloading (the innermost wrapper of each block: its weights must be on the device inside
   the checkpoint's recompute and inside activation hooks);
3. the tiled MLP and norms (submodules of the blocks);
4. the activation mode (the block wrappers, or hooks, and the manager): INSTALLERS maps each mode's
   options class to the mode that installs it.

Each step pushes its undos onto the handle (handle.py); if a step fails, the handle pops what the
earlier ones pushed, so a failed install leaves the model as it was."""
from typing import List, Optional

from torch import nn

from .config.mode_options import (ActivationsOptions, AutoOptions, DiskOptions, HiddenStatesOptions, ModulesOptions,
                                  SelectiveOptions, SyncOptions)
from .config.offload_config import OffloadConfig
from .handle import OffloadHandle
from .layers.frozen_weights import offload_layers
from .loss.lm_loss import chunk_lm_loss
from .modes.activations import Activations
from .modes.auto import Auto
from .modes.hidden_states import HiddenStates
from .modes.modules import Modules
from .modes.selective import Selective
from .tiling.tiled_mlp import find_mlps, find_norms, tile_mlp


def installer_for(options):
    """The mode that installs `options` (an instance of one of the config's mode options classes)."""
    return INSTALLERS[type(options)]


_activations = Activations()
# Each options class's mode: the one registry of what installs a mode.
INSTALLERS = {HiddenStatesOptions: HiddenStates(), SelectiveOptions: Selective(), ActivationsOptions: _activations,
              SyncOptions: _activations, DiskOptions: _activations, ModulesOptions: Modules(),
              AutoOptions: Auto(installer_for)}


def _chunked_loss(handle: OffloadHandle, config: OffloadConfig, blocks, manager) -> None:
    options = config.chunked_loss
    if options:
        handle.chunked_loss = chunk_lm_loss(handle.model, options.chunk_tokens, grads_in_forward=options.grads_in_forward)
        handle.push(handle.chunked_loss.remove)


def _layer_offloading(handle: OffloadHandle, config: OffloadConfig, blocks, manager) -> None:
    options = config.layer_offloading
    if options:
        handle.layers = offload_layers(handle.model, blocks, max_in_flight=options.max_in_flight,
                                       host_budget_bytes=options.host_budget_bytes,
                                       node_host_budget_bytes=options.node_host_budget_bytes,
                                       keep_layers_that_fit=options.keep_layers_that_fit)
        handle.push(handle.layers.remove)


def _tiling(handle: OffloadHandle, config: OffloadConfig, blocks, manager) -> None:
    options = config.tiling
    if not options:
        return
    if options.mlp:
        handle.tiled_mlp = tile_mlp(handle.model, mlps=find_mlps(handle.model, blocks), tile_tokens=options.tile_tokens)
        handle.push(handle.tiled_mlp.remove)
    norms = find_norms(blocks) if options.norms else []
    if norms:
        handle.tiled_norms = tile_mlp(handle.model, mlps=norms, tile_tokens=options.tile_tokens)
        handle.push(handle.tiled_norms.remove)


def _activations(handle: OffloadHandle, config: OffloadConfig, blocks, manager) -> None:
    if config.activations is not None:
        installer_for(config.activations).install(handle, blocks, config.activations, manager)


STEPS = (_chunked_loss, _layer_offloading, _tiling, _activations)


def install(model: nn.Module, config: OffloadConfig, blocks: Optional[List[nn.Module]], manager=None,
            notes=()) -> OffloadHandle:
    """The handle of `config` (resolved: every part on or off) installed on `model`'s `blocks`, with
    a ready activation `manager` or one built from the options; `notes` for explain()."""
    handle = OffloadHandle(model, config, notes)
    try:
        for step in STEPS:
            step(handle, config, blocks, manager)
    except BaseException:
        handle.remove()
        raise
    return handle


def wraps_blocks(config: OffloadConfig) -> bool:
    """Whether installing `config` needs the model's blocks."""
    needs = config.activations is not None and installer_for(config.activations).wraps_blocks
    return bool(needs or config.layer_offloading or config.tiling or config.long_context)
