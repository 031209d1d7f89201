"""resolve(): an OffloadConfig made fully specified for a model, before anything is installed: every
part on (its options) or off (False), and the notes handle.explain() prints.

Without long_context, a part not given is off. With long_context=True, what training a sequence far
longer than gradient checkpointing fits needs is turned on where it applies, unless given:
- the activation mode: the one given (default "hidden_states": every block's input in host memory,
  the least the GPU keeps of any mode that recomputes);
- layer offloading of the frozen weights (the base under LoRA adapters), where the blocks have any,
  keeping on the GPU the layers that fit in the room the first step at each input size leaves;
- the chunked loss (no vocabulary x tokens logits), where the model is a causal LM with a loss;
- the host budget: the boundaries take host RAM up to what is available (less a reserve and the
  frozen weights layer offloading pins), and what goes beyond spills to unnamed files in `disk_dir`
  (the system's temporary directory unless given: the files have no name, so nothing is left behind
  however the process ends), read back ahead of the backward;
- the tiled MLP (no tokens x ffn intermediate), where the blocks have an MLP, and tiled norms (no
  float32 copy of the whole hidden states saved for backward), where the blocks have RMSNorm or
  LayerNorm children.
"""
import dataclasses
import tempfile
from typing import List, NamedTuple, Optional

from torch import nn

from ._library import node_budget
from ._library.dtensors import is_dtensor
from .config.mode_options import ManagerOptions
from .config.offload_config import OffloadConfig
from .config.parts import ChunkedLossOptions, LayerOffloadingOptions, TilingOptions
from .layers.frozen_weights import available_host_bytes
from .loss.lm_loss import chunked_lm_loss_target
from .tiling.tiled_mlp import find_mlps, find_norms

# Host RAM left to everything else (the process, the page cache, other ranks' spikes) when the
# boundaries' budget comes from what is available: the larger of these.
HOST_RESERVE_BYTES = 8 << 30
HOST_RESERVE_SHARE = 0.1
GIB = 2 ** 30


class Note(NamedTuple):
    """One line of handle.explain(): a part, what was chosen, and why."""

    part: str
    chosen: str
    why: str


class Resolved(NamedTuple):
    config: OffloadConfig  # every part on (its options) or off (False)
    notes: List[Note]


def resolve(config: OffloadConfig, model: nn.Module, blocks: Optional[List[nn.Module]], manager,
            mode_given: bool = True) -> Resolved:
    """`config` with every part decided for `model` and its `blocks` (needed with long_context).
    `manager`: a ready activation manager (then its host budget is used as it is); `mode_given`:
    whether the user named the activation mode (for the note)."""
    off = {name: False for name in ("layer_offloading", "chunked_loss", "tiling") if getattr(config, name) is None}
    if not config.long_context:
        return Resolved(dataclasses.replace(config, long_context=False, **off), [])
    notes = [Note("activation mode", str(config.mode_name), "as given (mode=)" if mode_given else
                  "the default: every block's input in host memory, the least GPU memory of the modes that "
                  "recompute")]
    frozen = _frozen_bytes(blocks)
    layers = _layer_offloading(config.layer_offloading, blocks, frozen, config.mode_name, notes)
    loss = _chunked_loss(config.chunked_loss, model, notes)
    activations = _host_budget(config.activations, manager, frozen if layers else 0, notes)
    tiling = _tiling(config.tiling, config.long_context.tile_tokens, model, blocks, notes)
    return Resolved(dataclasses.replace(config, activations=activations, layer_offloading=layers, chunked_loss=loss,
                                        tiling=tiling), notes)


def _frozen_bytes(blocks) -> int:
    frozen = {id(p): p for block in blocks for p in block.parameters() if not p.requires_grad}
    return sum(p.numel() * p.element_size() for p in frozen.values())


def _layer_offloading(given, blocks, size: int, mode_name: Optional[str], notes: List[Note]):
    """`size`: the bytes of the blocks' frozen weights."""
    if given is not None:
        notes.append(Note("layer offloading", "on" if given else "off", "as given (layer_offloading=)"))
        return given
    if not size:
        notes.append(Note("layer offloading", "off", "every parameter of the blocks trains: no frozen weight to move"))
        return False
    if any(is_dtensor(p) for block in blocks for p in block.parameters()):
        notes.append(Note("layer offloading", "off", f"the blocks' parameters are sharded (FSDP2 or tensor parallel: "
                          f"DTensors), so each rank already holds a share of the {size / GIB:.2f} GiB of frozen "
                          "weights; layer offloading moves whole weights (fully_shard's CPUOffloadPolicy keeps "
                          "the shards in host memory instead)"))
        return False
    placed = (f"{size / GIB:.2f} GiB of frozen weights in {len(blocks)} blocks live in host memory and visit the "
              "GPU while their block runs")
    if mode_name == "auto":
        # auto's trials compare the candidates' peaks: weights that stay from the second step on
        # would land inside the trials, and a later candidate's higher peak beside them could fail.
        notes.append(Note("layer offloading", "on", f"{placed}; every block at every step: mode 'auto' measures "
                          "its candidates' peaks, which kept weights would change between trials"))
        return LayerOffloadingOptions()
    notes.append(Note("layer offloading", "on", f"{placed}; from the second step at each input size, the blocks "
                      "whose weights fit in the GPU memory the first step left keep them there "
                      "(keep_layers_that_fit; handle.layers.kept_layers lists them)"))
    return LayerOffloadingOptions(keep_layers_that_fit=True)


def _chunked_loss(given, model, notes: List[Note]):
    if given is not None:
        notes.append(Note("chunked loss", "on" if given else "off", "as given (chunked_loss=)"))
        return given
    options = ChunkedLossOptions()
    try:
        chunked_lm_loss_target(model, options.chunk_tokens, options.grads_in_forward)
    except (TypeError, ValueError) as error:
        notes.append(Note("chunked loss", "off", f"not a causal LM whose loss can be chunked: {error}"))
        return False
    notes.append(Note("chunked loss", "on", f"the loss over chunks of {options.chunk_tokens} tokens: no logits of "
                      "the whole sequence; its gradients computed in the forward (the LM head's product once)"))
    return options


def _host_budget(options, manager, pinned_bytes: int, notes: List[Note]):
    """The activation mode's options with a host budget and a spill directory, each unless given."""
    if manager is not None:
        notes.append(Note("host budget", "the given manager's", "manager= is used as it is"))
        return options
    if not isinstance(options, ManagerOptions):
        if options is not None:  # mode "auto": each trial's manager
            notes.append(Note("host budget", "as given", f"mode={options.mode_name!r} takes host_budget_bytes= for "
                              "each trial's manager and does not spill"))
        return options
    if getattr(options, "disk_only", False) or options.mode_name == "disk":
        notes.append(Note("host budget", "none: disk only", "every boundary goes to disk"))
        return options
    changes = {}
    given = options.host_budget_bytes or options.node_host_budget_bytes
    if given:
        name = "host_budget_bytes" if options.host_budget_bytes else "node_host_budget_bytes"
        budget, why = given, f"as given ({name}={given})"
    else:
        available = available_host_bytes()
        if available is None:
            notes.append(Note("host budget", "none", "the host's available memory is unknown (no /proc/meminfo)"))
            return options
        total = node_budget.host_memory_bytes("MemTotal") or available
        reserve = max(HOST_RESERVE_BYTES, int(HOST_RESERVE_SHARE * total))
        budget = max(1 << 30, available - pinned_bytes - reserve)
        ranks = node_budget.local_world_size()
        changes["node_host_budget_bytes" if ranks > 1 else "host_budget_bytes"] = budget
        pinned = f" and {pinned_bytes / GIB:.1f} GiB of frozen weights" if pinned_bytes else ""
        why = (f"{available / GIB:.1f} GiB of host memory available less a reserve of {reserve / GIB:.1f} GiB{pinned}"
               + (f", shared by {ranks} ranks" if ranks > 1 else ""))
    if options.disk_dir:
        where = f"{options.disk_dir} (as given)"
    else:
        changes["disk_dir"] = tempfile.gettempdir()
        where = f"unnamed files in {changes['disk_dir']} (disk_dir= to choose)"
    notes.append(Note("host budget", f"{budget / GIB:.1f} GiB, then disk",
                      f"{why}; beyond it the boundaries spill to {where}"))
    return dataclasses.replace(options, **changes) if changes else options


def _tiling(given, tile_tokens, model, blocks, notes: List[Note]):
    if given is not None:
        notes.append(Note("tiling", "on" if given else "off", "as given (tiling=)"))
        return given
    size = (f"{tile_tokens} tokens per tile" if tile_tokens else
            "tiles sized at the first call of each length from the memory left (listed below)")
    try:
        mlps = find_mlps(model, blocks)
    except ValueError as error:
        mlps = []
        notes.append(Note("tiled MLP", "off", f"no MLP found in the blocks: {error}"))
    else:
        notes.append(Note("tiled MLP", "on", f"{len(mlps)} MLPs computed over tiles of the sequence, {size}"))
    norms = find_norms(blocks)
    if norms:
        notes.append(Note("tiled norms", "on", f"{len(norms)} norms computed over tiles: their float32 copies of "
                          f"the hidden states, saved for backward, exist one tile at a time; {size}"))
    else:
        notes.append(Note("tiled norms", "off", "no RMSNorm or LayerNorm directly in the blocks"))
    if not (mlps or norms):
        return False
    return TilingOptions(mlp=bool(mlps), norms=bool(norms), tile_tokens=tile_tokens)
