"""Checks the keyword arguments a user gave apply() against what the chosen mode takes, so that an
error names apply() and the argument, not the class the options are passed on to."""
import inspect
from typing import Iterable

from ..manager import OffloadManager

# Options that build the OffloadManager: not allowed together with a ready manager=.
MANAGER_OPTIONS = tuple(inspect.signature(OffloadManager).parameters)
# Options of offload_activations ("all", "sync", "disk" and "modules" modes).
ACTIVATION_OPTIONS = ("min_bytes", "max_in_flight", "prefetch_depth", "host_budget_bytes", "node_host_budget_bytes",
                      "disk_dir", "disk_direct_io", "keep_on_device_bytes")

# Why an option a user may expect is not taken, or what they may have meant.
_HINTS = {
    "targets": "targets is for mode='modules'",
    "presets": "presets is for mode='modules'",
    "min_bytes": "min_bytes is for modes 'all', 'sync', 'disk' and 'modules'",
    "layers": "the blocks to wrap are blocks=[...]; frozen-weight offloading is layer_offloading=True",
    "layer_offload": "did you mean layer_offloading=True?",
}


def check_options(mode, options: dict, manager, allowed: Iterable[str], why: dict = None) -> None:
    """Raises TypeError for an option `mode` does not take and ValueError for manager options
    given together with a manager. `why`: reasons specific to the mode (they win over _HINTS)."""
    allowed = tuple(allowed)
    for name in options:
        if name not in allowed:
            hint = (why or {}).get(name) or _HINTS.get(name)
            takes = ", ".join(allowed) if allowed else "no options"
            raise TypeError(f"torch_offload.apply(mode={mode!r}) got an unexpected keyword argument "
                            f"{name!r}" + (f" ({hint})" if hint else "") + f"; mode={mode!r} takes: {takes}")
    clashing = [name for name in options if name in MANAGER_OPTIONS]
    if manager is not None and clashing:
        raise ValueError(f"torch_offload.apply: pass either manager= or the options that build one "
                         f"({', '.join(clashing)}), not both")


def check_use_reentrant(mode, value) -> bool:
    """use_reentrant= of apply(): True picks our reentrant checkpoint (reentrant.py), False (the
    default) torch's non-reentrant one under ours."""
    if not isinstance(value, bool):
        raise TypeError(f"torch_offload.apply(mode={mode!r}): use_reentrant={value!r}; expected True or False")
    return value


def take_link_budget(mode, options: dict):
    """keep_on_device_bytes="auto" (modes "all" and "modules"): returns the options without it and
    True, for watch_link; otherwise the options and False."""
    if options.get("keep_on_device_bytes") != "auto":
        return dict(options), False
    if mode not in ("all", "modules"):
        raise ValueError(f"torch_offload.apply(mode={mode!r}): keep_on_device_bytes='auto' sizes the window "
                         "from the link each step in modes 'all' and 'modules'; here pass a number of bytes "
                         "(mode='auto' sizes it for the checkpointing modes)")
    options = dict(options)
    del options["keep_on_device_bytes"]
    return options, True


def watch_link(handle, model, link_budget: bool) -> None:
    """With keep_on_device_bytes="auto": handle.link_budget sizes the manager's window each step."""
    if link_budget:
        from ..link_budget import LinkBudget

        handle.link_budget = LinkBudget(handle.manager)
        handle.on_remove(*handle.link_budget.watch(model))
