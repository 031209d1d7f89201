"""apply(model, mode=...): turns offloading on for a model's blocks (decoder layers).

apply() does the shared work once: it reads the mode's options (a frozen dataclass per mode,
modes/), finds and checks the blocks, turns on the chunked loss and layer offloading when asked,
builds the manager and the handle; the mode then installs what wraps each block (MODES).
"""
import dataclasses
from typing import Iterable, Optional

from torch import nn

from .blocks import blocks_to_wrap
from .handle import OffloadHandle
from .layers.frozen_weights import offload_layers
from .long_context import LongContextPlan, long_context_settings
from .loss.lm_loss import chunk_lm_loss_option
from .modes.activations import Activations
from .modes.auto import Auto
from .modes.hidden_states import HiddenStates
from .modes.mode import Mode
from .modes.modules import Modules
from .modes.options import OptionError, field_names, parse
from .modes.selective import Selective


class _NoActivations(Mode):
    """mode=None: no activation offloading (layer offloading alone)."""

    name = None
    wraps_blocks = False

    @dataclasses.dataclass(frozen=True)
    class options_type:
        pass

    hints = {"min_bytes": "mode=None offloads no activations; offload_layers takes its own options"}

    def manager_kwargs(self, options, blocks):
        return None

    def new_handle(self, model, manager, blocks, options) -> OffloadHandle:
        if manager is not None:
            raise OptionError("manager is for activation offloading (mode=None has none; offload_layers takes "
                              "its own)")
        return OffloadHandle(model, None, None)

    def install(self, handle, blocks, options) -> None:
        pass


def _registry() -> dict:
    hidden_states, selective = HiddenStates(), Selective()
    modes = [hidden_states, selective, Activations("all"), Activations("sync"), Activations("disk"), Modules(),
             Auto(hidden_states, selective)]
    return {mode.name: mode for mode in modes}


# mode name -> Mode
MODES = _registry()
# The names axolotl and TRL configs use.
ALIASES = {True: "all", "true": "all", "legacy": "sync"}
_NONE = _NoActivations()
# Which modes take each option (for "x is an option of mode='selective'").
_TAKEN_BY = {}
for _mode in MODES.values():
    for _name in field_names(_mode.options_type):
        _TAKEN_BY.setdefault(_name, []).append(_mode.name)


class _DefaultMode(str):
    """The default of apply(mode=): a str, told apart from a mode the user wrote (errors then say
    which mode apply() used)."""


def apply(
    model: nn.Module,
    mode=_DefaultMode("hidden_states"),
    blocks: Optional[Iterable[nn.Module]] = None,
    manager=None,
    *,
    layer_offloading: Optional[bool] = None,
    chunked_loss=None,
    long_context=False,
    **options,
) -> OffloadHandle:
    """Turns on offloading for `model` and returns an OffloadHandle (stats(), remove()).

    mode="hidden_states": each block runs under torch_offload.checkpoint while the model is training
    and grad is enabled: its input (the hidden states) moves to pinned host memory during forward
    and comes back, prefetched, when backward recomputes the block.
    mode="selective": like "hidden_states", and inside each block the op outputs a policy names
    (policy="attention": the fused attention outputs and logsumexp; "attention+qkv+out_proj" and
    other projection groups; a torch policy function) are offloaded instead of recomputed.
    mode="auto": the first training steps try hidden_states, the selective policies and torch's
    checkpointing, and keep the fastest whose peak memory fits memory_budget_gb (handle.explain()).
    mode="all" (alias "true", or True) / "sync" (alias "legacy") / "disk": the activations that
    autograd saves inside every block but the last are offloaded, nothing is recomputed.
    mode="modules": only the activations saved inside the submodules `targets` / `presets` select.
    mode=None: no activation offloading (with layer_offloading=True: layer offloading only).

    The keyword options are the fields of the mode's options (torch_offload.modes:
    HiddenStatesOptions, SelectiveOptions, AutoOptions, ActivationsOptions, ModulesOptions); an
    option the mode does not take is a TypeError naming it and the mode.

    blocks: the modules to wrap (default: the decoder layers of a Hugging Face model, PEFT-wrapped
    too, find_blocks). manager: a ready OffloadManager instead of the options that build one.
    layer_offloading=True: the frozen weights of every block live in host memory and visit the GPU
    only while the block runs (offload_layers); handle.layers.
    chunked_loss=True (or a number of tokens per chunk, or a dict of chunk_lm_loss's keywords): a
    Hugging Face causal LM trained with labels computes its loss over chunks of tokens without
    materialising the logits (chunk_lm_loss); handle.chunked_loss.
    long_context=True (or {"tile_tokens": N}): for sequences far longer than checkpointing fits, also
    turns on, where they apply and unless said otherwise, the chunked loss, the tiled MLP and norms (tile_mlp),
    layer offloading of frozen weights, and a host budget from the available host RAM beyond which
    the boundaries spill to disk (long_context.py); handle.explain() says what and why.

    On a Hugging Face model apply() turns the model's own gradient checkpointing off and, in the
    checkpointing modes, sets config.use_cache=False (with a warning); remove() restores both.
    """
    spec, opts, call = read_options(mode, options, manager)
    plan = None
    if long_context is not False and long_context is not None:
        plan = LongContextPlan(long_context_settings(long_context, call))
        plan.note("activation mode", str(spec.name), "as given (mode=)" if type(mode) is not _DefaultMode else
                  "the default: every block's input in host memory, the least GPU memory of the modes that "
                  "recompute")
    if spec.wraps_blocks or layer_offloading or plan is not None:
        blocks = blocks_to_wrap(model, blocks)
    elif blocks is not None:
        blocks = list(blocks)
    layers = loss = handle = None
    try:
        if plan is not None:
            layer_offloading = plan.layer_offloading(blocks, layer_offloading)
            loss = plan.chunked_loss(model, chunked_loss)
        if chunked_loss is not False and chunked_loss is not None:  # the LM head and loss, not the blocks
            loss = chunk_lm_loss_option(model, chunked_loss)
        # Layer offloading goes innermost: its weights must be on the device inside the checkpoint's
        # recompute and inside activation hooks.
        if layer_offloading:
            layers = offload_layers(model, blocks)
        if plan is not None:  # after layer offloading, whose pinned weights the available memory excludes
            opts = plan.host_budget(opts, manager)
            plan.tile(model, blocks)
        try:
            if manager is None:
                manager = spec.build_manager(opts, blocks)
            handle = spec.new_handle(model, manager, blocks, opts)
        except OptionError as error:
            raise error.kind(f"{call}: {error}") from None
        spec.install(handle, blocks, opts)
    except Exception:
        for undo in (handle, layers, loss, plan):
            if undo is not None:
                undo.remove()
        raise
    handle.layers, handle.chunked_loss, handle.long_context = layers, loss, plan
    return handle


def read_options(mode, options: dict, manager=None, call: str = None):
    """(the Mode, its options dataclass, the call as errors name it) for apply(model, mode, **options):
    what apply() checks before it looks at the model. Raises ValueError for an unknown mode,
    TypeError / ValueError for an option the mode does not take or a wrong value (naming the keyword
    and the mode), ValueError for manager= together with the options that build one. `call`: the
    caller's name in errors (default: torch_offload.apply(mode=...))."""
    name = ALIASES.get(mode, mode) if isinstance(mode, (str, bool)) else mode
    if name is not None and name not in MODES:
        names = tuple(MODES) + tuple(k for k in ALIASES if isinstance(k, str))
        raise ValueError(f"{call or 'torch_offload.apply'}: unknown mode {mode!r}; expected one of {names} or None")
    spec = MODES[name] if name is not None else _NONE
    if type(mode) is _DefaultMode:
        call, said = call or "torch_offload.apply()", f"mode={name!r} (the default)"
    else:
        said = f"mode={mode!r}"
        call = call or f"torch_offload.apply({said})"
    options = {k: v for k, v in options.items() if not (k in ("targets", "presets") and v is None)}  # defaults
    opts = parse(spec.options_type, options, call, said, spec.hints, _TAKEN_BY)
    clashing = [key for key in options if key in spec.manager_keywords()]
    if manager is not None and clashing:
        raise ValueError(f"{call}: pass either manager= or the options that build one ({', '.join(clashing)}), "
                         "not both")
    return spec, opts, call
