"""Which submodules mode="modules" offloads inside: targets (fnmatch patterns on qualified names,
module classes) and presets (presets.py) -> the modules where offloading turns on, and the
modules inside those where it turns off again.

Each target or preset covers the modules it selects and everything inside them, except what a
preset leaves out ("core_attn" leaves out the projections of self_attn); a module is offloaded
inside if any of them covers it, so presets=["qkv", "core_attn"] offloads q/k/v_proj but not
o_proj. Hooks go only where coverage changes between a module and its parent.
"""
import fnmatch
from typing import Iterable, List, NamedTuple, Tuple, Union

from torch import nn

from .presets import PRESETS, preset_modules

Target = Union[str, type]
Named = List[Tuple[str, nn.Module]]


class ModuleSelection(NamedTuple):
    selected: Named  # offloading turns on inside these (outermost covered modules)
    excluded: Named  # and off again inside these (outermost uncovered modules inside selected ones)


def _as_list(values, what: str) -> list:
    if values is None:
        return []
    if isinstance(values, (str, type)):
        return [values]  # one name: not its characters as patterns
    try:
        return list(values)
    except TypeError:
        raise TypeError(f"torch_offload: {what} must be a list, got {values!r}") from None


def _target_matches(model: nn.Module, targets: list) -> set:
    patterns = [t for t in targets if isinstance(t, str)]
    types = tuple(t for t in targets if isinstance(t, type))
    if len(patterns) + len(types) != len(targets):
        raise TypeError(f"torch_offload: targets must be name patterns (str) or module classes, got {targets!r}")
    return {name for name, module in model.named_modules()
            if name and (isinstance(module, types) or any(fnmatch.fnmatchcase(name, p) for p in patterns))}


def plan_modules(model: nn.Module, targets: Iterable[Target] = (), presets: Iterable[str] = ()) -> ModuleSelection:
    """The modules to enter offloading in and to leave it in again; raises ValueError when nothing
    is selected (naming the targets) and for an unknown or empty preset (presets.py)."""
    targets, presets = _as_list(targets, "targets"), _as_list(presets, "presets")
    if not targets and not presets:
        raise ValueError("torch_offload: targets and presets are both empty")
    # (include, exclude) name sets, one per source: all targets together, then each preset.
    sources = [(_target_matches(model, targets), set())] if targets else []
    for preset in presets:
        found = preset_modules(model, preset)
        sources.append((set(found.include), set(found.exclude)))
    covered_by = {"": [False] * len(sources)}  # the root itself is never selected
    selection = ModuleSelection([], [])
    for name, module in model.named_modules():
        if not name:
            continue
        parent = covered_by[name.rpartition(".")[0]]
        covered_by[name] = [name in include or (up and name not in exclude)
                            for (include, exclude), up in zip(sources, parent)]
        now, before = any(covered_by[name]), any(parent)
        if now != before:
            (selection.selected if now else selection.excluded).append((name, module))
    if not selection.selected:
        hint = [t for t in targets if t in PRESETS]
        raise ValueError(f"torch_offload: no submodule matches targets={targets!r}"
                         + (f" ({hint[0]!r} is a preset: presets={hint!r})" if hint else ""))
    return selection


def select_modules(model: nn.Module, targets: Iterable[Target] = (), *, presets: Iterable[str] = ()) -> Named:
    """Submodules whose qualified name matches a pattern (fnmatch: "*.self_attn", "*.mlp.up_proj"),
    whose type is one of the given classes, or that a preset selects ("qkv", "core_attn"; see
    presets.PRESETS); modules inside a selected one are not repeated."""
    return plan_modules(model, targets, presets).selected
