"""apply(model, config): the front door. It takes an OffloadConfig (or a mode's name and its options
as keywords, which build one: config/keywords.py), resolves it for the model (resolve.py: every part
decided, with the notes explain() prints) and installs it (install.py: ordered steps on one undo
stack), returning the OffloadHandle."""
from typing import Iterable, Optional

from torch import nn

from .blocks import blocks_to_wrap
from .config.errors import OptionError
from .config.offload_config import OffloadConfig
from .config.keywords import PART_KEYWORDS, DefaultMode, config_from_keywords, describe_call
from .config.mode_options import MODE_OPTIONS
from .handle import OffloadHandle
from .install import install, wraps_blocks
from .resolve import resolve

CALL = "torch_offload.apply"


def apply(
    model: nn.Module,
    config=DefaultMode("hidden_states"),
    blocks: Optional[Iterable[nn.Module]] = None,
    manager=None,
    *,
    layer_offloading=None,
    chunked_loss=None,
    tiling=None,
    long_context=None,
    **options,
) -> OffloadHandle:
    """Turns on offloading for `model` and returns an OffloadHandle (stats(), explain(), remove()).

    `config`: an OffloadConfig (torch_offload.config), a mode's options (e.g. SelectiveOptions(...)),
    or a mode's name, also written mode=..., whose options are then the keyword arguments:
    mode="hidden_states" (the default): each block runs under torch_offload.checkpoint while the
    model is training and grad is enabled: its input (the hidden states) moves to pinned host memory
    during forward and comes back, prefetched, when backward recomputes the block.
    mode="selective": like "hidden_states", and inside each block the op outputs a policy names
    (policy="attention": the fused attention outputs and logsumexp; "attention+qkv+out_proj" and
    other projection groups; a torch policy function) are offloaded instead of recomputed.
    mode="auto": the first training steps try hidden_states, the selective policies and torch's
    checkpointing, and keep the fastest whose peak memory fits memory_budget_gb (handle.explain()).
    mode="all" (alias "true", or True) / "sync" (alias "legacy") / "disk": the activations that
    autograd saves inside every block but the last are offloaded, nothing is recomputed.
    mode="modules": only the activations saved inside the submodules `targets` / `presets` select.
    mode=None: no activation offloading (with layer_offloading=True: layer offloading only).
    The keyword options are the fields of the mode's options class (HiddenStatesOptions,
    SelectiveOptions, AutoOptions, ActivationsOptions, SyncOptions, DiskOptions, ModulesOptions); an
    option the mode does not take is a TypeError naming it and the mode.

    blocks: the modules to wrap (default: the decoder layers of a Hugging Face model, PEFT-wrapped
    too, find_blocks). manager: a ready OffloadManager instead of the options that build one.
    layer_offloading=True (or LayerOffloadingOptions): the frozen weights of every block live in
    host memory and visit the GPU only while the block runs (offload_layers); handle.layers.
    chunked_loss=True (or a number of tokens per chunk, a dict of chunk_lm_loss's keywords,
    ChunkedLossOptions): a Hugging Face causal LM trained with labels computes its loss over chunks
    of tokens without materialising the logits (chunk_lm_loss); handle.chunked_loss.
    tiling=True (or TilingOptions): the blocks' MLPs and norms computed over tiles of the sequence
    (tile_mlp); handle.tiled_mlp, handle.tiled_norms.
    long_context=True (or {"tile_tokens": N}, LongContextOptions): for sequences far longer than
    checkpointing fits, also turns on, where they apply and unless said otherwise, the chunked loss,
    the tiling, layer offloading of frozen weights, and a host budget from the available host RAM
    beyond which the boundaries spill to disk (resolve.py); handle.explain() says what and why.
    With a config object, these go into the config, not beside it.

    On a Hugging Face model apply() turns the model's own gradient checkpointing off and, in the
    checkpointing modes, sets config.use_cache=False (with a warning); remove() restores both. A
    failed apply() leaves the model as it was.
    """
    config, call, mode_given = read_config(config, options, dict(layer_offloading=layer_offloading,
                                                                 chunked_loss=chunked_loss, tiling=tiling,
                                                                 long_context=long_context))
    check_manager(config, manager, call)
    if wraps_blocks(config):
        blocks = blocks_to_wrap(model, blocks)
    elif blocks is not None:
        blocks = list(blocks)
    try:
        resolved = resolve(config, model, blocks, manager, mode_given)
        return install(model, resolved.config, blocks, manager, resolved.notes)
    except OptionError as error:
        raise error.naming(call) from None


def read_config(config, options: dict, parts: dict, name: str = CALL):
    """(the OffloadConfig, the call as errors name it, whether the user named the mode) for an entry
    point `name` given `config` (an OffloadConfig, a mode's options, a mode's name, or a DefaultMode),
    keyword `options` (mode= among them) and the parts' keywords (None where not given). What every
    entry point checks before it looks at the model."""
    if "mode" in options:
        if not isinstance(config, DefaultMode):
            raise TypeError(f"{name}() got the mode twice: as an argument ({config!r}) and as mode=")
        config = options.pop("mode")
    given_parts = {key: value for key, value in parts.items() if value is not None}
    if isinstance(config, OffloadConfig) or type(config) in MODE_OPTIONS:
        call = f"{name}({type(config).__name__}(...))"
        if options or (isinstance(config, OffloadConfig) and given_parts):
            extra = sorted(options) + sorted(given_parts)
            raise TypeError(f"{call} got keyword arguments {extra} beside a config object: put them in the "
                            "config (dataclasses.replace(config, ...)), or pass the mode's name and keywords")
        if isinstance(config, OffloadConfig):
            return config, call, True
        try:
            return OffloadConfig(config, **given_parts), call, True
        except OptionError as error:
            raise error.naming(call) from None
    return (config_from_keywords(config, options, name, given_parts), describe_call(name, config)[0],
            not isinstance(config, DefaultMode))


def read_options(config, options: dict, name: str):
    """(the OffloadConfig, the call as errors name it) of a later apply(model, config, **options), for
    an entry point `name` that applies when training begins (a trainer's callback): what apply checks
    before it looks at the model, checked now, so that a wrong mode or option raises where it was
    written. blocks= is left for apply."""
    rest = {key: value for key, value in options.items() if key not in ("blocks", "manager") + PART_KEYWORDS}
    parts = {key: options.get(key) for key in PART_KEYWORDS}
    config, call, _ = read_config(config, rest, parts, name)
    check_manager(config, options.get("manager"), call)
    return config, call


def check_manager(config: OffloadConfig, manager, call: str) -> None:
    """A ready manager= replaces the options that build one: refused beside them, and where the mode
    has no manager to replace."""
    if manager is None:
        return
    if config.activations is None:
        raise ValueError(f"{call}: manager is for activation offloading (mode=None has none; offload_layers takes "
                         "its own)")
    if config.is_auto:
        raise ValueError(f"{call}: manager= is not taken (auto builds one manager per candidate); pass "
                         "max_in_flight= / host_budget_bytes= instead")
    clashing = config.activations.manager_fields_set()
    if clashing:
        raise ValueError(f"{call}: pass either manager= or the options that build one ({', '.join(clashing)}), "
                         "not both")
