"""apply(model, ..., long_context=True): what training a sequence far longer than gradient
checkpointing fits needs, turned on together, each part with the reason it was or was not.

- the activation mode: the one given (default "hidden_states": every block's input in host memory,
  the least the GPU keeps of any mode that recomputes);
- the chunked loss (no vocabulary x tokens logits), where the model is a causal LM with a loss;
- the tiled MLP (no tokens x ffn intermediate), where the blocks have an MLP, and tiled norms (no
  float32 copy of the whole hidden states saved for backward), where the blocks have RMSNorm or
  LayerNorm children;
- layer offloading of the frozen weights (the base under LoRA adapters), where the blocks have any;
- the host budget: the boundaries take host RAM up to what is available when apply() runs (less a
  reserve), and what goes beyond it spills to files in `disk_dir` (a new folder in the system's
  temporary directory unless given), read back ahead of the backward.

An option the user passed explicitly (layer_offloading=False, chunked_loss=..., host_budget_bytes,
disk_dir, a ready manager) is used as given. handle.explain() tells the choices.
"""
import dataclasses
import shutil
import tempfile
from typing import List, Optional

from torch import nn

from ._engine import node_budget
from .copies import NotPicklable
from .layers.frozen_weights import available_host_bytes
from .loss.lm_loss import chunk_lm_loss
from .tiling.tiled_mlp import find_mlps, find_norms, tile_mlp

# Host RAM left to everything else (the process, the page cache, other ranks' spikes) when the
# boundaries' budget comes from what is available: the larger of these.
HOST_RESERVE_BYTES = 8 << 30
HOST_RESERVE_SHARE = 0.1
_SETTINGS = ("tile_tokens",)


def long_context_settings(value, call: str) -> dict:
    """apply(long_context=value): True, or a dict of settings ({"tile_tokens": N})."""
    if value is True:
        return {}
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(_SETTINGS))
        if unknown:
            raise TypeError(f"{call}: long_context={value!r} has unknown keys {unknown}; expected True or a dict "
                            f"of {list(_SETTINGS)}")
        return dict(value)
    raise ValueError(f"{call}: long_context={value!r}; expected True, False or a dict such as "
                     "{'tile_tokens': 8192}")


class LongContextPlan(NotPicklable):
    """The parts long_context=True turned on, and why (explain())."""

    _pickled_what = "its long-context plan"

    def __init__(self, settings: dict):
        self.settings = settings
        self.choices: List[tuple] = []  # (part, what was chosen, why)
        self.tiled_mlp = None  # TiledMLPHandle of the blocks' MLPs
        self.tiled_norms = None  # TiledMLPHandle of the blocks' norms
        self.spill_dir: Optional[str] = None  # the folder made for spills (removed by remove())
        self._made_dir = False

    def note(self, part: str, chosen: str, why: str) -> None:
        self.choices.append((part, chosen, why))

    def layer_offloading(self, blocks: List[nn.Module], said) -> bool:
        frozen = {id(p): p for block in blocks for p in block.parameters() if not p.requires_grad}
        size = sum(p.numel() * p.element_size() for p in frozen.values())
        if said is not None:
            self.note("layer offloading", "on" if said else "off", "as given (layer_offloading=)")
            return bool(said)
        if not frozen:
            self.note("layer offloading", "off", "every parameter of the blocks trains: no frozen weight to move")
            return False
        self.note("layer offloading", "on", f"{size / 2**30:.2f} GiB of frozen weights in {len(blocks)} blocks "
                  "live in host memory and visit the GPU while their block runs")
        return True

    def chunked_loss(self, model: nn.Module, said):
        """The ChunkedLossHandle to use, or None (said: what apply() got for chunked_loss)."""
        if said is not None:
            self.note("chunked loss", "off" if said is False else "on", "as given (chunked_loss=)")
            return None
        try:
            handle = chunk_lm_loss(model)
        except (TypeError, ValueError) as error:
            self.note("chunked loss", "off", f"not a causal LM whose loss can be chunked: {error}")
            return None
        self.note("chunked loss", "on", f"the loss over chunks of {handle.chunk_tokens} tokens: no logits of "
                  "the whole sequence")
        return handle

    def tile(self, model: nn.Module, blocks: List[nn.Module]) -> None:
        tile_tokens = self.settings.get("tile_tokens")
        size = (f"{tile_tokens} tokens per tile" if tile_tokens else
                "tiles sized at the first call of each length from the memory left (listed below)")
        try:
            mlps = find_mlps(model, blocks)
        except ValueError as error:
            self.note("tiled MLP", "off", f"no MLP found in the blocks: {error}")
        else:
            self.tiled_mlp = tile_mlp(model, mlps=mlps, tile_tokens=tile_tokens)
            self.note("tiled MLP", "on", f"{len(mlps)} MLPs computed over tiles of the sequence, {size}")
        norms = find_norms(blocks)
        if not norms:
            self.note("tiled norms", "off", "no RMSNorm or LayerNorm directly in the blocks")
            return
        self.tiled_norms = tile_mlp(model, mlps=norms, tile_tokens=tile_tokens)
        self.note("tiled norms", "on", f"{len(norms)} norms computed over tiles: their float32 copies of the "
                  f"hidden states, saved for backward, exist one tile at a time; {size}")

    def host_budget(self, options, manager) -> object:
        """The mode's options with a host budget and a spill folder, each unless given."""
        if manager is not None:
            self.note("host budget", "the given manager's", "manager= is used as it is")
            return options
        if not hasattr(options, "host_budget_bytes"):
            return options  # no activation manager (mode=None)
        if getattr(options, "disk_only", False):
            self.note("host budget", "none: disk only", "as given (disk_only=True)")
            return options
        changes = {}
        given = options.host_budget_bytes or options.node_host_budget_bytes
        if given:
            name = "host_budget_bytes" if options.host_budget_bytes else "node_host_budget_bytes"
            budget, why = given, f"as given ({name}={given})"
        else:
            available = available_host_bytes()
            if available is None:
                self.note("host budget", "none", "the host's available memory is unknown (no /proc/meminfo)")
                return options
            total = node_budget.host_memory_bytes("MemTotal") or available
            budget = max(1 << 30, available - max(HOST_RESERVE_BYTES, int(HOST_RESERVE_SHARE * total)))
            ranks = node_budget.local_world_size()
            changes["node_host_budget_bytes" if ranks > 1 else "host_budget_bytes"] = budget
            why = (f"{available / 2**30:.1f} GiB of host memory available less a reserve of "
                   f"{(available - budget) / 2**30:.1f} GiB" + (f", shared by {ranks} ranks" if ranks > 1 else ""))
        if options.disk_dir:
            where = f"{options.disk_dir} (as given)"
        else:
            self.spill_dir = changes["disk_dir"] = tempfile.mkdtemp(prefix="torch_offload_spill_")
            self._made_dir = True
            where = f"{self.spill_dir}, made for it (disk_dir= to choose)"
        self.note("host budget", f"{budget / 2**30:.1f} GiB, then disk", f"{why}; beyond it the boundaries spill to "
                  f"{where}")
        return dataclasses.replace(options, **changes) if changes else options

    def explain(self) -> str:
        lines = ["torch_offload long_context=True", "", "| part | chosen | why |", "|---|---|---|"]
        lines += [f"| {part} | {chosen} | {why} |" for part, chosen, why in self.choices]
        for what, handle in (("MLP", self.tiled_mlp), ("norm", self.tiled_norms)):
            tiles = {} if handle is None else handle.tiles()
            if tiles:
                lines += ["", f"tokens per {what} tile, by sequence length: "
                          + ", ".join(f"{length}: {tile}" for length, tile in sorted(tiles.items()))]
        return "\n".join(lines) + "\n"

    def remove(self) -> None:
        for handle in (self.tiled_mlp, self.tiled_norms):
            if handle is not None:
                handle.remove()
        self.tiled_mlp = self.tiled_norms = None
        if self._made_dir:
            shutil.rmtree(self.spill_dir, ignore_errors=True)
            self._made_dir = False

