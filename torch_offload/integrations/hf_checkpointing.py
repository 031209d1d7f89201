"""gradient_checkpointing_enable(model): a Hugging Face model's own gradient checkpointing, in
transformers' terms (gradient_checkpointing_kwargs, every_n_layers), running torch_offload's
checkpoint: each checkpointed layer's input waits in pinned host memory instead of on the GPU.

transformers' model.gradient_checkpointing_enable() picks the layers and installs
functools.partial(torch.utils.checkpoint.checkpoint, **gradient_checkpointing_kwargs) as each
module's `_gradient_checkpointing_func`, which its layers call (GradientCheckpointingLayer). No
public argument takes another function, so after that public call one private step remains:
_checkpoint_functions() replaces the function, keeping the keywords transformers installed (those a
wrapper of gradient_checkpointing_enable added, such as TRL's selective checkpointing, included).
take_over() does the same for a model whose checkpointing is on already (the Trainer's).
"""
import dataclasses
import functools
import inspect
from typing import List, Optional

from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from ..checkpointing.checkpoint import checkpoint
from ..config.errors import OptionError
from ..config.offload_config import OffloadConfig
from ..config.keywords import build_options
from ..config.mode_options import (MODE_OPTIONS, ActivationsOptions, AutoOptions, HiddenStatesOptions, ModulesOptions,
                                   SelectiveOptions, canonical_mode, options_type)
from ..copy_and_pickle import NotPicklable
from ..handle import OffloadHandle
from ..install import installer_for
from ..modes.first_restores import prefetch_first_restores
from ..modes.selective import block_checkpoint, scope_blocks
from .unwrapping import unwrap

CALL = "torch_offload.integrations.gradient_checkpointing_enable"
# The modes the model's gradient checkpointing can run: those that checkpoint each layer.
CHECKPOINTING_OPTIONS = (HiddenStatesOptions, SelectiveOptions)
# The keywords torch_offload.checkpoint takes as torch.utils.checkpoint.checkpoint does: what
# gradient_checkpointing_kwargs may hold (manager= is an argument of ours, not one of transformers').
TORCH_KEYWORDS = tuple(name for name, parameter in inspect.signature(checkpoint).parameters.items()
                       if parameter.kind is parameter.KEYWORD_ONLY and name != "manager")
OFFLOAD_REFUSED = (
    "offload=True is transformers' own offloading of the same tensors (torch.autograd.graph.save_on_cpu "
    "around torch's checkpoint, its copies on the compute stream); torch_offload's checkpoint replaces that "
    "function and keeps each checkpointed layer's input in pinned host memory itself, its copies on a side "
    "stream, so offload=True would be silently dropped: leave it off")
_KWARGS_HINTS = {
    "every_n_layers": "pass every_n_layers= as an argument, as model.gradient_checkpointing_enable takes it",
    "offload": "offload is an argument of gradient_checkpointing_enable, and only False is taken",
    "manager": "pass manager= as an argument",
    "selective": "TRL's SFTConfig key, which SFTTrainer takes out before it reaches the checkpoint; for "
                 "selective offloading pass mode='selective'",
    "policy": "policy= is an option of mode='selective', an argument",
    "min_bytes": "min_bytes= is an option of mode='selective', an argument",
}
_OPTION_HINTS = dict(
    {name: f"{name} is a key of gradient_checkpointing_kwargs here, as in transformers" for name in TORCH_KEYWORDS},
    use_reentrant="use_reentrant is a key of gradient_checkpointing_kwargs here, as in transformers: "
                  "gradient_checkpointing_kwargs={'use_reentrant': True}",
    blocks="the layers are those the model's own gradient checkpointing checkpoints (every_n_layers picks "
           "them); torch_offload.apply(model, blocks=[...]) takes other blocks",
    layer_offloading="layer offloading comes with torch_offload.apply(model, 'hidden_states', layer_offloading=True)",
    chunked_loss="call torch_offload.chunk_lm_loss(model) beside it, or use torch_offload.apply(model, "
                 "chunked_loss=True)",
)
_NOT_OPTIONS = ("use_reentrant", "blocks", "layer_offloading", "chunked_loss")


def _checkpoint_functions(model: nn.Module, replace=None) -> list:
    """The one place that touches transformers' private attribute `_gradient_checkpointing_func`:
    the function each module with a `gradient_checkpointing` flag calls to checkpoint (what
    _set_gradient_checkpointing installs and GradientCheckpointingLayer.__call__ calls; no public
    API sets it). Returns [(module, its function, None where unset)]; with `replace`, also sets each
    module's function to replace(module, that function) (None: unset).

    Flags and functions are read from the instance and its class, not through __getattr__: a
    PeftModel forwards unknown attributes to the model it wraps."""
    found = []
    for module in model.modules():
        if "gradient_checkpointing" not in module.__dict__ and not hasattr(type(module), "gradient_checkpointing"):
            continue
        current = module.__dict__.get("_gradient_checkpointing_func")
        found.append((module, current))
        if replace is not None:
            new = replace(module, current)
            if new is None:
                module.__dict__.pop("_gradient_checkpointing_func", None)
            else:
                setattr(module, "_gradient_checkpointing_func", new)
    return found


class CheckpointFunction(NotPicklable):
    """What the model's checkpointed layers call instead of transformers' partial of
    torch.utils.checkpoint.checkpoint: torch_offload.checkpoint (or selective_checkpoint) with the
    same keywords, our manager and, in mode "selective", the layer's policy and the layer itself (to
    find its projections). An object, not a closure: copy.deepcopy(model) binds the copy's to the
    copy's layer and manager (copy_and_pickle.py)."""

    _pickled_what = "torch_offload's gradient checkpointing function"

    def __init__(self, checkpoint_function, keywords: dict):
        self.checkpoint_function, self.keywords = checkpoint_function, keywords

    def __call__(self, function, *args, **kwargs):
        return self.checkpoint_function(function, *args, **{**self.keywords, **kwargs})

    def __repr__(self):
        shown = {k: v for k, v in self.keywords.items() if k not in ("manager", "block", "scoping")}
        return f"torch_offload.{self.checkpoint_function.__name__}(**{shown})"


class HFCheckpointingHandle(OffloadHandle):
    """What gradient_checkpointing_enable returns: an OffloadHandle (model, mode, manager, blocks:
    the checkpointed layers; stats(), remove()) whose `gradient_checkpointing_kwargs` are the keywords
    the layers' checkpoint runs with. remove() turns the model's gradient checkpointing off with
    transformers' gradient_checkpointing_disable() (or, where it was on before, puts back the
    functions and flags it had) and releases our manager; stats() then returns the statistics it had
    when removed."""

    def __init__(self, model: nn.Module, config: OffloadConfig, manager, blocks: List[nn.Module], keywords: dict,
                 previous: list, was_on: bool, call: str):
        super().__init__(model, config)
        self.manager = manager
        self.gradient_checkpointing_kwargs = keywords
        self._layers = list(blocks)
        self._final_stats: Optional[dict] = None
        self.push(functools.partial(restore, model, previous, was_on))  # undone last

    @property
    def blocks(self) -> List[nn.Module]:
        return list(self._layers)

    def stats(self) -> dict:
        if self.manager is None and self._final_stats is not None:
            return dict(self._final_stats)
        return super().stats()

    def remove(self) -> None:
        if self.manager is not None:
            self._final_stats = super().stats()
        super().remove()
        self._layers = []
        self.manager = None  # ours: no module refers to it any more


def _why_not(options_class) -> str:
    """Why a mode does not run through the model's gradient checkpointing."""
    if options_class is None:
        return "offloads no activations"
    if options_class is ModulesOptions:
        return "offloads the activations saved inside chosen submodules and recomputes nothing"
    if issubclass(options_class, ActivationsOptions):
        return "offloads saved activations and recomputes nothing"
    if options_class is AutoOptions:
        return "measures its candidates with checkpoint wrappers of its own"
    return "does not checkpoint each layer"


def check_options(mode, options: dict, call: str, manager=None, hints: Optional[dict] = None):
    """The mode's options (HiddenStatesOptions or SelectiveOptions) for `mode` (a name, a mode's
    options or an OffloadConfig) and keyword `options` (without use_reentrant, which
    gradient_checkpointing_kwargs carries): errors name `call`, the mode and the keyword."""
    if isinstance(mode, OffloadConfig) or type(mode) in MODE_OPTIONS:
        given = mode.activations if isinstance(mode, OffloadConfig) else mode
        if isinstance(mode, OffloadConfig):
            parts = mode.parts_on()
            if parts:
                raise TypeError(f"{call}: the config turns on {', '.join(parts)}, which the model's gradient "
                                "checkpointing does not run; torch_offload.apply(model, config) does")
        if options:
            raise TypeError(f"{call} got keyword arguments {sorted(options)} beside a config object: put them in "
                            "the config")
        if type(given) not in CHECKPOINTING_OPTIONS:
            raise ValueError(f"{call}: {type(given).__name__ if given is not None else 'activations=None'} "
                             f"{_why_not(type(given) if given is not None else None)}, so it does not run through "
                             "the model's gradient checkpointing, which takes mode 'hidden_states' or 'selective'")
        if given.use_reentrant:
            raise TypeError(f"{call}: use_reentrant comes from gradient_checkpointing_kwargs here, as in "
                            "transformers: leave it False in the options")
        opts = given
    else:
        try:
            name = canonical_mode(mode)
        except ValueError:
            raise ValueError(f"{call}: unknown mode {mode!r}; the model's gradient checkpointing runs mode "
                             "'hidden_states' or 'selective'") from None
        cls = options_type(name) if name is not None else None
        if cls not in CHECKPOINTING_OPTIONS:
            runs_it = f"; torch_offload.apply(model, {mode!r}) runs it" if mode is not None else ""
            raise ValueError(f"{call}: mode={mode!r} {_why_not(cls)}, so it does not run through the model's "
                             f"gradient checkpointing, which takes mode 'hidden_states' or 'selective'{runs_it}")
        # The mode's options but those transformers' terms carry (use_reentrant) or this route has no use for.
        refused = {name: {**_OPTION_HINTS, **(hints or {})}[name] for name in _NOT_OPTIONS}
        opts = build_options(cls, options, call, f"mode={mode!r}", refused=refused, extra=("manager",),
                             hints={**_OPTION_HINTS, **(hints or {})})
    clashing = opts.manager_fields_set() if manager is not None else []
    if clashing:
        raise ValueError(f"{call}: pass either manager= or the options that build one ({', '.join(clashing)}), "
                         "not both")
    return opts


def with_use_reentrant(opts, keywords: dict, call: str):
    """The options with use_reentrant as the checkpoint keywords have it, checked against the policy."""
    try:
        return dataclasses.replace(opts, use_reentrant=bool(keywords.get("use_reentrant")))
    except OptionError as error:
        raise error.naming(call) from None


def check_checkpoint_kwargs(kwargs, opts, where: str, call: str) -> dict:
    """`kwargs` (gradient_checkpointing_kwargs, or the keywords transformers installed), checked: each
    a keyword torch_offload.checkpoint takes (in mode "selective" not context_fn: the policy is the
    context). Returns them as a dict."""
    if not isinstance(kwargs, dict):
        raise TypeError(f"{call}: {where} must be a dict, got {type(kwargs).__name__}")
    selective = isinstance(opts, SelectiveOptions)
    takes = tuple(name for name in TORCH_KEYWORDS if not (selective and name == "context_fn"))
    for key in kwargs:
        if key in takes:
            continue
        if key == "offload" and kwargs[key]:
            raise ValueError(f"{call}: {where} has offload=True: {OFFLOAD_REFUSED}")
        if key == "context_fn":
            raise ValueError(f"{call}: {where} has context_fn, and mode='selective' brings its own (the policy= "
                             "picks what is offloaded); drop context_fn, or use mode='hidden_states', which runs "
                             "it")
        hint = _KWARGS_HINTS.get(key)
        raise TypeError(f"{call}: {where} has {key!r}, which torch_offload.checkpoint does not take"
                        + (f" ({hint})" if hint else "") + f"; it takes: {', '.join(takes)}")
    if kwargs.get("use_reentrant") not in (None, True, False):
        raise TypeError(f"{call}: {where} has use_reentrant={kwargs['use_reentrant']!r}; expected True or False")
    return dict(kwargs)


def gradient_checkpointing_enable(model: nn.Module, mode: str = "hidden_states", gradient_checkpointing_kwargs=None,
                                  every_n_layers: int = 1, offload: bool = False, *, manager=None,
                                  **options) -> HFCheckpointingHandle:
    """model.gradient_checkpointing_enable(gradient_checkpointing_kwargs, every_n_layers) (transformers'
    own, public) with torch_offload's checkpoint as the function its layers call: each checkpointed
    layer's input goes to pinned host memory in forward and comes back, prefetched, when backward
    recomputes the layer. Returns an HFCheckpointingHandle (stats(), remove()).

    mode="hidden_states": torch_offload.checkpoint. mode="selective": selective_checkpoint, whose
    policy= (and block_policies=, one per checkpointed layer) offloads op outputs inside each layer.
    gradient_checkpointing_kwargs: as transformers takes them (default {"use_reentrant": False}): the
    keywords of torch.utils.checkpoint.checkpoint (use_reentrant, preserve_rng_state,
    determinism_check, context_fn, debug, early_stop), as torch_offload.checkpoint takes them; any
    other key is a TypeError naming it. every_n_layers: only every n-th layer is checkpointed (and
    offloaded), as transformers picks them. offload=True (transformers' save_on_cpu offloading) is
    refused: ours replaces it. manager= (a ready OffloadManager) or the mode's manager options
    (max_in_flight, prefetch_depth, host_budget_bytes, ...) build one manager for every layer.

    `model` may be what accelerator.prepare(model) returned (the model inside is used). Sets
    config.use_cache=False, with a warning (remove() restores it)."""
    opts = check_options(mode, options, CALL, manager)
    if offload:
        raise ValueError(f"{CALL}: {OFFLOAD_REFUSED}")
    if type(every_n_layers) is not int or every_n_layers < 1:
        raise ValueError(f"{CALL}: every_n_layers={every_n_layers!r}; expected an int >= 1 (1: every layer)")
    kwargs = {"use_reentrant": False} if gradient_checkpointing_kwargs is None else gradient_checkpointing_kwargs
    kwargs = check_checkpoint_kwargs(kwargs, opts, "gradient_checkpointing_kwargs", CALL)
    # use_reentrant against the policy now, before the model changes (_install checks again what
    # transformers installed).
    with_use_reentrant(opts, kwargs, CALL)
    inner = unwrap(model)
    enable = getattr(inner, "gradient_checkpointing_enable", None)
    if not callable(enable):
        raise TypeError(f"{CALL}: {type(inner).__name__} has no gradient_checkpointing_enable() (a Hugging Face "
                        "PreTrainedModel has it); for another model use torch_offload.apply(model, 'hidden_states', "
                        "blocks=[...])")
    previous = _free_model_state(inner, CALL)
    was_on = any(flag for _, flag, _ in previous)
    # every_n_layers only where asked for: transformers before it took the argument takes the rest.
    enable(gradient_checkpointing_kwargs=kwargs, **({"every_n_layers": every_n_layers} if every_n_layers != 1 else {}))
    try:
        return _install(inner, opts, manager, previous, was_on, CALL,
                        "the keywords model.gradient_checkpointing_enable installed")
    except BaseException:
        restore(inner, previous, was_on)
        raise


def take_over(model: nn.Module, mode: str, call: str, where: str, manager=None, **options) -> HFCheckpointingHandle:
    """For a model whose gradient checkpointing is on already (the Trainer's: TrainingArguments(
    gradient_checkpointing=True)): the same layers, flags and keywords, with torch_offload's checkpoint
    as the function (OffloadCallback(hf_checkpointing=True)). remove() puts transformers' back."""
    opts = check_options(mode, options, call, manager)
    inner = unwrap(model)
    previous = _free_model_state(inner, call)
    if not any(flag for _, flag, _ in previous):
        raise ValueError(f"{call} runs the model's own gradient checkpointing with torch_offload's checkpoint, and "
                         "it is off: set TrainingArguments(gradient_checkpointing=True) (TRL's SFTConfig has it on "
                         "by default) or call model.gradient_checkpointing_enable()")
    try:
        return _install(inner, opts, manager, previous, True, call, where)
    except BaseException:
        restore(inner, previous, True)
        raise


def _free_model_state(model: nn.Module, call: str) -> list:
    """[(module, flag, function)] of the model's gradient checkpointing now, after checking that
    neither apply() nor this route already offloads it (a layer checkpointed twice recomputes twice)."""
    if any("_torch_offload_handle" in module.__dict__ for module in model.modules()):
        raise ValueError(f"{call}: torch_offload.apply() already checkpoints this model's layers; call its "
                         "handle's remove() first")
    state = [(module, bool(getattr(module, "gradient_checkpointing")), function)
             for module, function in _checkpoint_functions(model)]
    if not state:
        raise ValueError(f"{call}: {type(model).__name__} has no module with a gradient_checkpointing flag: its "
                         "layers cannot be checkpointed by transformers' gradient checkpointing")
    if any(isinstance(function, CheckpointFunction) for _, _, function in state):
        raise ValueError(f"{call}: the model's gradient checkpointing runs torch_offload's checkpoint already; "
                         "call remove() on the handle that turned it on first")
    return state


def _installed_keywords(model: nn.Module, call: str) -> dict:
    """The keywords of the function transformers installed: functools.partial(
    torch.utils.checkpoint.checkpoint, **keywords), the same object on every module. Anything else
    (offload=True's save_on_cpu wrapper, another library's function, a changed transformers) is an
    error here, not a silent change of what runs."""
    functions = {id(function): function for _, function in _checkpoint_functions(model) if function is not None}
    function = next(iter(functions.values()), None)
    if (len(functions) != 1 or not isinstance(function, functools.partial) or function.func is not torch_checkpoint
            or function.args):
        import transformers

        found = ", ".join(sorted({repr(f) for f in functions.values()})) or "no function"
        raise RuntimeError(f"{call}: the model's layers checkpoint with {found}, not one functools.partial("
                           f"torch.utils.checkpoint.checkpoint, **kwargs) as transformers {transformers.__version__}'s "
                           "gradient_checkpointing_enable installs it, so torch_offload cannot run its own checkpoint "
                           "with the same keywords (was it enabled with offload=True, or by another library?)")
    return dict(function.keywords)


def _checkpointed_layers(model: nn.Module) -> List[nn.Module]:
    """The layers the model's gradient checkpointing checkpoints: transformers' GradientCheckpointingLayer
    modules whose flag is on (every_n_layers left the others off); for a model without them, every
    module whose flag is on."""
    flagged = [module for module in model.modules() if getattr(module, "gradient_checkpointing", False) is True]
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return flagged
    return [module for module in flagged if isinstance(module, GradientCheckpointingLayer)] or flagged


def _install(model, opts, manager, previous, was_on, call, where) -> HFCheckpointingHandle:
    keywords = check_checkpoint_kwargs(_installed_keywords(model, call), opts, where, call)
    # use_reentrant comes from the keywords; the mode's options check it against the policy now.
    opts = with_use_reentrant(opts, keywords, call)
    layers = _checkpointed_layers(model)
    chose_depth = manager is None and opts.prefetch_depth is None
    try:
        if manager is None:
            manager = installer_for(opts).build_manager(opts, layers)
        functions = _functions(opts, layers, manager, keywords, chose_depth)
    except OptionError as error:
        raise error.naming(call) from None
    _checkpoint_functions(model, lambda module, current: functions.get(id(module), functions[None]))
    handle = HFCheckpointingHandle(model, OffloadConfig(opts), manager, layers, keywords, previous, was_on, call)
    if isinstance(opts, SelectiveOptions):
        for layer, scoping in zip(layers, scope_blocks(handle, layers, opts.policies_for(layers))):
            functions[id(layer)].keywords["scoping"] = scoping
    handle.disable_kv_cache(call)
    prefetch_first_restores(handle)  # the last layer's input comes back during the LM head's backward
    return handle


def _functions(opts, layers, manager, keywords, chose_depth: bool) -> dict:
    """id(module) -> its CheckpointFunction; None -> the one for every other module."""
    if not isinstance(opts, SelectiveOptions):
        return {None: CheckpointFunction(checkpoint, dict(keywords, manager=manager))}
    base = dict(keywords, manager=manager, min_bytes=opts.min_bytes)
    functions = {id(layer): CheckpointFunction(block_checkpoint(manager, chose_depth), dict(base, policy=policy,
                                                                                             block=layer))
                 for layer, policy in zip(layers, opts.policies_for(layers))}
    functions[None] = CheckpointFunction(block_checkpoint(manager, chose_depth), dict(base, policy=opts.policy_name))
    return functions


def restore(model: nn.Module, previous: list, was_on: bool) -> None:
    """Puts the model's gradient checkpointing back: off (transformers' gradient_checkpointing_disable)
    where it was off, else the functions and flags it had."""
    if not was_on:
        model.gradient_checkpointing_disable()
        return
    functions = {id(module): function for module, _, function in previous}
    _checkpoint_functions(model, lambda module, current: functions.get(id(module), current))
    for module, flag, _ in previous:
        module.gradient_checkpointing = flag
