"""Keywords are sugar for an OffloadConfig: apply(model, "all", min_bytes=0, layer_offloading=True)
builds OffloadConfig(ActivationsOptions(min_bytes=0), layer_offloading=True) here, with errors that
name the call and the keyword the user wrote. Every entry point that takes a mode and its options as
keywords (apply, OffloadCallback, gradient_checkpointing_enable, compile) builds its config here."""
import dataclasses
import difflib
from typing import Dict

from .errors import OptionError
from .offload_config import PARTS, OffloadConfig
from .mode_options import ManagerOptions, canonical_mode, mode_names, options_taken_by, options_type

# apply()'s own keywords besides the mode's options.
PART_KEYWORDS = tuple(PARTS)
APPLY_KEYWORDS = ("mode", "blocks", "manager", *PART_KEYWORDS)
# Why a keyword a user may write is not an option, or what they may have meant; a mode adds its own.
HINTS = {
    "layers": "the blocks to wrap are blocks=[...]; frozen-weight offloading is layer_offloading=True",
    "layer_offload": "did you mean layer_offloading=True?",
}


class DefaultMode(str):
    """A mode name an entry point used by default, told apart from one the user wrote (errors then
    say which mode was used)."""


def field_names(options_type) -> tuple:
    """The options of a dataclass, the mode's own first, then those of its manager."""
    names = [f.name for f in dataclasses.fields(options_type)]
    manager = [f.name for f in dataclasses.fields(ManagerOptions)]
    return tuple([n for n in names if n not in manager] + [n for n in names if n in manager])


def describe_call(name: str, mode) -> tuple:
    """(the call as errors name it, how they name the mode): "torch_offload.apply(mode='all')",
    "mode='all'"; for a default mode "torch_offload.apply()", "mode='hidden_states' (the default)"."""
    if isinstance(mode, DefaultMode):
        return f"{name}()", f"mode={str(mode)!r} (the default)"
    return f"{name}(mode={mode!r})", f"mode={mode!r}"


def build_options(options_type, keywords: dict, call: str, said: str, refused: Dict[str, str] = None,
                  extra: tuple = (), hints: Dict[str, str] = None):
    """options_type(**keywords), with errors that name `call` (as the user wrote it), the mode (`said`)
    and the keyword written.

    An unknown keyword is a TypeError that says why (`hints`, the mode's own, then HINTS; else which
    other modes take it; else the closest option or apply() keyword) and lists what the mode takes;
    a wrong value is the OptionError its dataclass raised, named. `refused`: fields the caller does
    not take (field -> why); `extra`: keywords the caller takes besides the fields (listed only)."""
    refused = refused or {}
    takes = tuple(name for name in field_names(options_type) if name not in refused)
    for name in keywords:
        if name in takes:
            continue
        hint = (refused.get(name) or (hints or {}).get(name) or getattr(options_type, "hints", {}).get(name)
                or HINTS.get(name))
        others = [repr(m) for m in options_taken_by().get(name, ())]
        if hint is None and others:
            hint = (f"{name} is for mode={others[0]}" if len(others) == 1 else
                    f"{name} is for modes {', '.join(others[:-1])} and {others[-1]}")
        if hint is None:
            close = difflib.get_close_matches(name, takes + (extra or APPLY_KEYWORDS), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}=?" if close else None
        listed = ", ".join(takes + extra) if takes + extra else "no options"
        raise TypeError(f"{call} got an unexpected keyword argument {name!r}" + (f" ({hint})" if hint else "")
                        + f"; {said} takes: {listed}")
    try:
        return options_type(**keywords)
    except OptionError as error:
        raise error.naming(call) from None


def mode_options(mode, options: dict, call: str, said: str, **build):
    """The options of `mode` (a name; None: no activation offloading) from keywords."""
    try:
        name = canonical_mode(mode)
    except ValueError as error:
        raise ValueError(f"{call}: {error}") from None
    if name is None:
        if options:
            key = next(iter(options))
            hint = f" ({HINTS[key]})" if key in HINTS else ""
            raise TypeError(f"{call} got an unexpected keyword argument {key!r}{hint}; {said} takes: no options "
                            "(mode=None offloads no activations; offload_layers takes its own options)")
        return None
    return build_options(options_type(name), options, call, said, **build)


def config_from_keywords(mode, options: dict, call: str, parts: Dict[str, object] = None) -> OffloadConfig:
    """OffloadConfig(the mode's options from `options`, **parts) for an entry point `call` (e.g.
    "torch_offload.apply"), errors naming what the user wrote. `mode` may be a DefaultMode."""
    call, said = describe_call(call, mode)
    activations = mode_options(mode, {k: v for k, v in options.items() if not (k in ("targets", "presets")
                                                                               and v is None)}, call, said)
    try:
        return OffloadConfig(activations, **(parts or {}))
    except OptionError as error:
        raise error.naming(call) from None


__all__ = ["APPLY_KEYWORDS", "DefaultMode", "PART_KEYWORDS", "build_options", "config_from_keywords",
           "describe_call", "field_names", "mode_names", "mode_options"]
