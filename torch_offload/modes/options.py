"""A mode's options: a frozen dataclass whose fields are the keyword arguments apply() takes in that
mode, built from what the user wrote (parse), so that an error names the keyword and the mode.

ManagerOptions holds the fields that configure the mode's OffloadManager; each mode's dataclass
adds its own and may give prefetch_depth another default. HiddenStatesOptions and ActivationsOptions
are here because modes "selective" and "modules" extend them.
"""
import dataclasses
import difflib
from typing import Dict, Iterable, Optional, Union

from .._engine.manager import DEFAULT_DISK_DIR, MANAGER_DEFAULTS

# Why a keyword a user may write is not an option, or what they may have meant; a mode adds its own.
HINTS = {
    "layers": "the blocks to wrap are blocks=[...]; frozen-weight offloading is layer_offloading=True",
    "layer_offload": "did you mean layer_offloading=True?",
}
# apply()'s own keywords: the "did you mean" of a misspelt one, and what OffloadCallback passes to
# apply() besides the mode's options.
APPLY_KEYWORDS = ("mode", "blocks", "manager", "layer_offloading", "chunked_loss", "long_context")


class OptionError(ValueError):
    """An option's value is wrong: the message says what was expected. `kind`: the exception apply()
    raises for it (TypeError for a value of the wrong type, ValueError for one out of range)."""

    def __init__(self, message: str, kind=ValueError):
        super().__init__(message)
        self.kind = kind


def check_int(name: str, value, minimum: int = 0) -> None:
    if type(value) is not int:  # bool is not an int here
        raise OptionError(f"{name}={value!r}; expected an int >= {minimum}", TypeError)
    if value < minimum:
        raise OptionError(f"{name}={value!r}; expected an int >= {minimum}")


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise OptionError(f"{name}={value!r}; expected True or False", TypeError)


@dataclasses.dataclass(frozen=True)
class ManagerOptions:
    """The OffloadManager of a mode.

    max_in_flight: device-to-host copies in flight before a save waits (0: unbounded).
    prefetch_depth: saves copied back ahead of need in backward (None: the mode's default).
    host_budget_bytes: the most pinned host memory the manager holds (0: unlimited).
    node_host_budget_bytes: instead, the host memory all ranks of this node share (each rank gets
        node_host_budget_bytes // LOCAL_WORLD_SIZE).
    disk_dir: the disk tier's directory: saves beyond host_budget_bytes spill there ("disk" mode and
        disk_only write everything there).
    disk_direct_io: the disk tier's files bypass the page cache (O_DIRECT); "auto": each file decides
        from the host's available memory.
    keep_on_device_bytes: the newest saves, up to this many bytes, stay on the GPU uncopied.
    """

    max_in_flight: int = MANAGER_DEFAULTS.max_in_flight
    prefetch_depth: Optional[int] = None
    host_budget_bytes: int = 0
    node_host_budget_bytes: int = 0
    disk_dir: Optional[str] = None
    disk_direct_io: Union[bool, str] = False
    keep_on_device_bytes: Union[int, str] = 0

    def __post_init__(self):
        for name in ("max_in_flight", "host_budget_bytes", "node_host_budget_bytes"):
            check_int(name, getattr(self, name))
        if self.prefetch_depth is not None:
            check_int("prefetch_depth", self.prefetch_depth)
        if self.keep_on_device_bytes != "auto":
            check_int("keep_on_device_bytes", self.keep_on_device_bytes)
        if self.disk_direct_io not in (True, False, "auto") or not isinstance(self.disk_direct_io, (bool, str)):
            raise OptionError(f"disk_direct_io={self.disk_direct_io!r}; expected True, False or 'auto'")
        if self.disk_dir is not None and not isinstance(self.disk_dir, str):
            object.__setattr__(self, "disk_dir", str(self.disk_dir))  # a pathlib.Path
        if self.disk_dir is not None and "\0" in self.disk_dir:
            raise OptionError(f"disk_dir={self.disk_dir!r} contains a NUL character; expected a directory's path")

    def manager_kwargs(self) -> dict:
        """OffloadManager's keyword arguments for these options (prefetch_depth where set)."""
        kwargs = dict(max_in_flight=self.max_in_flight, host_budget_bytes=self.host_budget_bytes,
                      node_host_budget_bytes=self.node_host_budget_bytes, disk_dir=self.disk_dir or "",
                      disk_direct_io=self.disk_direct_io, keep_on_device_bytes=self.keep_on_device_bytes)
        if self.prefetch_depth is not None:
            kwargs["prefetch_depth"] = self.prefetch_depth
        return kwargs


MANAGER_FIELDS = tuple(f.name for f in dataclasses.fields(ManagerOptions))


@dataclasses.dataclass(frozen=True)
class HiddenStatesOptions(ManagerOptions):
    """Options of mode="hidden_states" (and the manager fields of ManagerOptions).

    prefetch_depth: block inputs copied back ahead of need in backward (default 1).
    disk_only: every block input goes to disk_dir (the disk tier), not host memory.
    use_reentrant: our reentrant checkpoint (cheaper on the host; gradients through .backward()
        only) instead of the non-reentrant one.
    """

    prefetch_depth: int = 1
    disk_only: bool = False
    use_reentrant: bool = False

    def __post_init__(self):
        super().__post_init__()
        check_bool("disk_only", self.disk_only)
        check_bool("use_reentrant", self.use_reentrant)

    def manager_kwargs(self) -> dict:
        return dict(super().manager_kwargs(), disk_only=self.disk_only)


DEFAULT_MIN_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class ActivationsOptions(ManagerOptions):
    """Options of modes "all", "sync" and "disk" (and the manager fields of ManagerOptions).

    min_bytes: saved tensors smaller than this stay on the device (default 1 MiB; a training step
        that offloads nothing warns, NothingOffloadedWarning).
    prefetch_depth: saves copied back ahead of need in backward (default 4; "sync" does not prefetch).
    keep_on_device_bytes: as ManagerOptions; "auto" (modes "all" and "modules") sizes the window from
        the link after every training step.
    disk_dir: where "disk" writes (default: a torch_offload folder in the system's temp dir) and where
        "all" spills beyond host_budget_bytes.
    """

    prefetch_depth: int = 4
    min_bytes: int = DEFAULT_MIN_BYTES

    def __post_init__(self):
        super().__post_init__()
        check_int("min_bytes", self.min_bytes)

    def activation_manager_kwargs(self, mode: str) -> dict:
        """OffloadManager's keyword arguments for `mode` ("all", "sync", "disk", "modules")."""
        if self.keep_on_device_bytes == "auto" and mode not in ("all", "modules"):
            raise OptionError("keep_on_device_bytes='auto' sizes the window from the link each step in modes "
                              "'all' and 'modules'; here pass a number of bytes (mode='auto' sizes it for the "
                              "checkpointing modes)")
        kwargs = self.manager_kwargs()
        if kwargs["keep_on_device_bytes"] == "auto":
            kwargs["keep_on_device_bytes"] = 0  # LinkBudget sets it after each step
        if mode == "sync":
            kwargs.update(synchronous=True, prefetch_depth=0)
        if mode == "disk":
            kwargs.update(disk_only=True, disk_dir=self.disk_dir or DEFAULT_DISK_DIR)
        return kwargs


def field_names(options_type) -> tuple:
    """The options of a dataclass, the mode's own first, then those of its manager."""
    names = [f.name for f in dataclasses.fields(options_type)]
    return tuple([n for n in names if n not in MANAGER_FIELDS] + [n for n in names if n in MANAGER_FIELDS])


def parse(options_type, keywords: dict, call: str, mode: str, hints: Dict[str, str] = None,
          taken_by: Dict[str, Iterable[str]] = None, refused: Dict[str, str] = None, extra: tuple = ()):
    """options_type(**keywords), with errors that name the call (`call`, as the user wrote it: e.g.
    "torch_offload.apply(mode='all')"), the mode (`mode`: "mode='all'", or for the default
    "mode='hidden_states' (the default)") and the keyword written.

    An unknown keyword is a TypeError that says why (`hints`, the mode's own first, then HINTS; else
    which other modes take it, from `taken_by`: keyword -> mode names; else the closest option or
    apply() keyword) and lists what the mode takes; a wrong value is a ValueError or TypeError.
    `refused`: fields the caller does not take (field -> why); `extra`: keywords the caller takes
    besides the fields (listed, not checked here)."""
    refused = refused or {}
    takes = tuple(name for name in field_names(options_type) if name not in refused)
    for name in keywords:
        if name in takes:
            continue
        hint = refused.get(name) or (hints or {}).get(name) or HINTS.get(name)
        others = [repr(m) for m in (taken_by or {}).get(name, ())]
        if hint is None and others:
            hint = (f"{name} is for mode={others[0]}" if len(others) == 1 else
                    f"{name} is for modes {', '.join(others[:-1])} and {others[-1]}")
        if hint is None:
            close = difflib.get_close_matches(name, takes + (extra or APPLY_KEYWORDS), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}=?" if close else None
        listed = ", ".join(takes + extra) if takes + extra else "no options"
        raise TypeError(f"{call} got an unexpected keyword argument {name!r}" + (f" ({hint})" if hint else "")
                        + f"; {mode} takes: {listed}")
    try:
        return options_type(**keywords)
    except OptionError as error:
        raise error.kind(f"{call}: {error}") from None
