"""The options of each activation mode: a frozen dataclass per mode whose fields are the keyword
options apply() takes in that mode (the manager's fields in ManagerOptions, their base), and the
table of modes by name (MODE_OPTIONS). `mode_name` is
the name apply(mode=...) gives it, `summary` what the mode does in a line, `hints` why a keyword a
user may expect is not one of its options.

HiddenStatesOptions and ActivationsOptions are the bases of SelectiveOptions and of the modes "sync",
"disk" and "modules"."""
import dataclasses
from typing import ClassVar, Dict, Optional, Union

from .._library.manager import MANAGER_DEFAULTS, hooks_mode_settings
from ..policies.named_policies import resolve
from ..policies.projections import is_fast_policy
from .errors import OptionTypeError, OptionValueError, check_bool, check_int
from .aliases import ALIASES, unalias
from .defaults import ACTIVATIONS_MIN_BYTES, MODULES_PREFETCH_DEPTH, SELECTIVE_MIN_BYTES


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
    disk_io_threads: the disk tier's IO threads; each write holds one and its staging buffer, so saves
        wait while this many writes are under way.
    keep_on_device_bytes: the newest saves, up to this many bytes, stay on the GPU uncopied.
    """

    max_in_flight: int = MANAGER_DEFAULTS.max_in_flight
    prefetch_depth: Optional[int] = None
    host_budget_bytes: int = 0
    node_host_budget_bytes: int = 0
    disk_dir: Optional[str] = None
    disk_direct_io: Union[bool, str] = False
    disk_io_threads: int = MANAGER_DEFAULTS.disk_io_threads
    keep_on_device_bytes: Union[int, str] = 0

    def __post_init__(self):
        for name in ("max_in_flight", "host_budget_bytes", "node_host_budget_bytes"):
            check_int(name, getattr(self, name))
        check_int("disk_io_threads", self.disk_io_threads, 1)
        if self.prefetch_depth is not None:
            check_int("prefetch_depth", self.prefetch_depth)
        if self.keep_on_device_bytes != "auto":
            check_int("keep_on_device_bytes", self.keep_on_device_bytes)
        if self.disk_direct_io not in (True, False, "auto") or not isinstance(self.disk_direct_io, (bool, str)):
            raise OptionValueError(f"disk_direct_io={self.disk_direct_io!r}; expected True, False or 'auto'")
        if self.disk_dir is not None:
            if not isinstance(self.disk_dir, str):
                object.__setattr__(self, "disk_dir", str(self.disk_dir))  # a pathlib.Path
            if "\0" in self.disk_dir:
                raise OptionValueError(f"disk_dir={self.disk_dir!r} contains a NUL character, which no path can "
                                       "hold")

    def manager_kwargs(self) -> dict:
        """OffloadManager's keyword arguments for these options (prefetch_depth where set)."""
        kwargs = dict(max_in_flight=self.max_in_flight, host_budget_bytes=self.host_budget_bytes,
                      node_host_budget_bytes=self.node_host_budget_bytes, disk_dir=self.disk_dir or "",
                      disk_direct_io=self.disk_direct_io, disk_io_threads=self.disk_io_threads,
                      keep_on_device_bytes=self.keep_on_device_bytes)
        if self.prefetch_depth is not None:
            kwargs["prefetch_depth"] = self.prefetch_depth
        return kwargs

    def manager_fields_set(self) -> list:
        """The fields that build the manager and differ from their default: what a ready manager=
        cannot be given together with."""
        return [f.name for f in dataclasses.fields(self) if f.name in self.manager_fields
                and getattr(self, f.name) != f.default]

    # The fields that configure the manager (a ready manager= takes their place).
    manager_fields = ("max_in_flight", "prefetch_depth", "host_budget_bytes", "node_host_budget_bytes", "disk_dir",
                      "disk_direct_io", "disk_io_threads", "keep_on_device_bytes")


@dataclasses.dataclass(frozen=True)
class HiddenStatesOptions(ManagerOptions):
    """Options of mode="hidden_states" (and the manager fields of ManagerOptions).

    prefetch_depth: block inputs copied back ahead of need in backward (default 1).
    disk_only: every block input goes to disk_dir (the disk tier), not host memory.
    use_reentrant: our reentrant checkpoint (cheaper on the host; gradients through .backward()
        only) instead of the non-reentrant one.
    """

    mode_name: ClassVar[str] = "hidden_states"
    summary: ClassVar[str] = "checkpointing, each block's input offloaded"
    hints: ClassVar[Dict[str, str]] = {
        "min_bytes": "mode='hidden_states' offloads each block's input whatever its size; min_bytes is for modes "
                     "'all', 'sync', 'disk' and 'modules'"}
    manager_fields = ManagerOptions.manager_fields + ("disk_only",)

    prefetch_depth: int = 1
    disk_only: bool = False
    use_reentrant: bool = False

    def __post_init__(self):
        super().__post_init__()
        check_bool("disk_only", self.disk_only)
        check_bool("use_reentrant", self.use_reentrant)

    def manager_kwargs(self) -> dict:
        return dict(super().manager_kwargs(), disk_only=self.disk_only)


@dataclasses.dataclass(frozen=True)
class SelectiveOptions(HiddenStatesOptions):
    """Options of mode="selective": those of "hidden_states", and

    policy: which op outputs of a block are offloaded (None: "attention"): "attention" (the fused
        attention outputs and logsumexp), "attention+<group>+..." (also the products of projection
        groups qkv, out_proj, fc1, fc2; "keep_<group>" keeps a group's products on the device),
        "attention_save" (kept on the device, torch's selective checkpointing), a list of ops to
        keep, or a torch policy function.
    block_policies: one policy per block, in the blocks' order, instead of `policy`.
    min_bytes: smaller outputs stay on the device (default 64 KiB).
    prefetch_depth: saves copied back ahead of need in backward (default: one block's saves, from the
        policy, raised to what each block saves in its first training forward).
    link_throttle: offload the policy's outputs of only as many blocks as this rank's share of the
        node's host link carries during the forward; the last blocks recompute theirs
        (hooks/link_budget.py). Off by default: its estimate of the link is conservative, and on a
        full node it lost more than it gained at 32K tokens (docs/performance.md); mode "auto",
        which measures, is the choice there.
    """

    mode_name: ClassVar[str] = "selective"
    summary: ClassVar[str] = "checkpointing, block inputs and the op outputs a policy names offloaded"
    hints: ClassVar[Dict[str, str]] = {}

    prefetch_depth: Optional[int] = None
    policy: object = None
    block_policies: Optional[list] = None
    min_bytes: int = SELECTIVE_MIN_BYTES
    link_throttle: bool = False

    def __post_init__(self):
        super().__post_init__()
        check_int("min_bytes", self.min_bytes)
        check_bool("link_throttle", self.link_throttle)
        if self.policy is not None and self.block_policies is not None:
            raise OptionValueError("pass policy= (every block) or block_policies= (one per block), not both")
        policies = self.block_policies if isinstance(self.block_policies, (list, tuple)) else [self.policy_name]
        for policy in policies:
            _check_policy(policy, self.use_reentrant)

    @property
    def policy_name(self):
        return self.policy if self.policy is not None else "attention"

    def policies_for(self, blocks) -> list:
        """One policy per block."""
        if self.block_policies is None:
            return [self.policy_name] * len(blocks)
        if not isinstance(self.block_policies, (list, tuple)) or len(self.block_policies) != len(blocks):
            length = (len(self.block_policies) if isinstance(self.block_policies, (list, tuple))
                      else type(self.block_policies).__name__)
            raise OptionValueError(f"block_policies has {length} entries for {len(blocks)} blocks; give one policy "
                                   "per block, in the blocks' order")
        return list(self.block_policies)


def _check_policy(policy, use_reentrant: bool) -> None:
    try:
        fast = is_fast_policy(policy)  # raises for a bad projection group
        if not fast:
            resolve(policy)
    except (TypeError, ValueError) as error:
        raise (OptionTypeError if isinstance(error, TypeError) else OptionValueError)(str(error)) from None
    if use_reentrant and not fast:
        raise OptionValueError(f"use_reentrant=True takes the named policies ('attention', 'attention+fc2', ...), "
                               f"got policy={policy!r}")


@dataclasses.dataclass(frozen=True)
class ActivationsOptions(ManagerOptions):
    """Options of mode="all" (alias "true") and, through SyncOptions and DiskOptions, of "sync" and
    "disk" (and the manager fields of ManagerOptions).

    min_bytes: saved tensors smaller than this stay on the device (default 1 MiB; a training step
        that offloads nothing warns, NothingOffloadedWarning).
    prefetch_depth: saves copied back ahead of need in backward (default 4; "sync" does not prefetch).
    keep_on_device_bytes: as ManagerOptions; "auto" (modes "all" and "modules") sizes the window from
        the link after every training step.
    disk_dir: where "disk" writes (default: a torch_offload folder in the system's temp dir) and where
        "all" spills beyond host_budget_bytes.
    """

    mode_name: ClassVar[str] = "all"
    summary: ClassVar[str] = "every saved activation of at least min_bytes offloaded, no recompute"
    hints: ClassVar[Dict[str, str]] = {}
    # Whether keep_on_device_bytes="auto" (sized from the link each step) is taken.
    sizes_window_from_link: ClassVar[bool] = True

    prefetch_depth: int = 4
    min_bytes: int = ACTIVATIONS_MIN_BYTES

    def __post_init__(self):
        super().__post_init__()
        check_int("min_bytes", self.min_bytes)
        if self.keep_on_device_bytes == "auto" and not self.sizes_window_from_link:
            raise OptionValueError("keep_on_device_bytes='auto' sizes the window from the link each step in modes "
                                   "'all' and 'modules'; here pass a number of bytes (mode='auto' sizes it for the "
                                   "checkpointing modes)")

    def manager_kwargs(self) -> dict:
        kwargs = super().manager_kwargs()
        if kwargs["keep_on_device_bytes"] == "auto":
            kwargs["keep_on_device_bytes"] = 0  # LinkBudget sets it after each step
        return kwargs


@dataclasses.dataclass(frozen=True)
class SyncOptions(ActivationsOptions):
    """Options of mode="sync" (alias "legacy"): those of "all"; every copy completes before forward
    goes on, and nothing is prefetched."""

    mode_name: ClassVar[str] = "sync"
    summary: ClassVar[str] = "all, each copy finished before the save returns"
    sizes_window_from_link: ClassVar[bool] = False

    def manager_kwargs(self) -> dict:
        return dict(super().manager_kwargs(), **hooks_mode_settings(self.mode_name))


@dataclasses.dataclass(frozen=True)
class DiskOptions(ActivationsOptions):
    """Options of mode="disk": those of "all"; every activation goes to files in disk_dir (default:
    a torch_offload folder in the system's temp dir)."""

    mode_name: ClassVar[str] = "disk"
    summary: ClassVar[str] = "all, every saved activation written to disk_dir"
    sizes_window_from_link: ClassVar[bool] = False

    def manager_kwargs(self) -> dict:
        return dict(super().manager_kwargs(), **hooks_mode_settings(self.mode_name, self.disk_dir))


@dataclasses.dataclass(frozen=True)
class ModulesOptions(ActivationsOptions):
    """Options of mode="modules": those of "all", and

    targets: fnmatch patterns on qualified module names ("*.self_attn") or module classes.
    presets: named module groups (targets/presets.py: core_attn, qkv, out_proj, attn, fc1, fc2, mlp,
        moe_router, moe_experts). At least one of targets and presets.
    prefetch_depth: saves copied back ahead of need in backward (default 8: a selected attention
        makes 5-6 copies per layer).
    """

    mode_name: ClassVar[str] = "modules"
    summary: ClassVar[str] = "the activations saved inside chosen submodules offloaded, no recompute"

    targets: object = None
    presets: object = None
    prefetch_depth: int = MODULES_PREFETCH_DEPTH

    def __post_init__(self):
        super().__post_init__()
        if not self.targets and not self.presets:
            raise OptionValueError("mode='modules' needs targets=[name patterns or module classes] and/or "
                                   "presets=[preset names, e.g. 'qkv', 'core_attn']")


# What mode "auto" measures (those whose projections the blocks have, by default). "checkpointing"
# (torch's checkpoint, nothing offloaded) is one because where the step is bound by the host (short
# sequences) it can be the fastest, and auto should never lose to it.
AUTO_CANDIDATES = ("hidden_states", "selective:attention", "selective:attention+qkv+out_proj", "checkpointing")


def is_auto_candidate(candidate) -> bool:
    if candidate in AUTO_CANDIDATES:
        return True
    kind, _, policy = str(candidate).partition(":")
    try:
        return kind == "selective" and is_fast_policy(policy)
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class AutoOptions:
    """Options of mode="auto".

    memory_budget_gb: the peak allocated memory a candidate may reach (default: torch
        checkpointing's, measured in its trial).
    trial_steps: training steps per candidate (the first warms up, the others are timed).
    candidates: what to try, from "hidden_states", "selective:attention",
        "selective:attention+qkv+out_proj", "checkpointing" or "selective:<named policy>" (default:
        those whose projections the blocks have).
    max_in_flight, host_budget_bytes: of each candidate's manager (see ManagerOptions).
    use_reentrant: every candidate in its reentrant variant (ours and torch's).
    """

    mode_name: ClassVar[str] = "auto"
    summary: ClassVar[str] = "trial steps of the checkpointing modes, then the fastest within the memory budget"
    hints: ClassVar[Dict[str, str]] = {
        "prefetch_depth": "mode='auto' sets each candidate's prefetch depth",
        "policy": "mode='auto' tries the selective policies itself (candidates=)",
        "keep_on_device_bytes": "mode='auto' sizes it from the memory left under memory_budget_gb"}
    manager_fields: ClassVar[tuple] = ("max_in_flight", "host_budget_bytes")

    memory_budget_gb: Optional[float] = None
    trial_steps: int = 3
    candidates: Optional[tuple] = None
    max_in_flight: int = MANAGER_DEFAULTS.max_in_flight
    host_budget_bytes: int = 0
    use_reentrant: bool = False

    def __post_init__(self):
        check_bool("use_reentrant", self.use_reentrant)
        check_int("max_in_flight", self.max_in_flight)
        check_int("host_budget_bytes", self.host_budget_bytes)
        if not isinstance(self.trial_steps, int) or self.trial_steps < 1:
            raise OptionValueError(f"trial_steps={self.trial_steps!r}; expected an int >= 1")
        if self.memory_budget_gb is not None and not self.memory_budget_gb > 0:
            raise OptionValueError(f"memory_budget_gb={self.memory_budget_gb!r}; expected a number > 0")
        if self.candidates is not None:
            candidates = tuple(self.candidates)
            if not candidates or not all(is_auto_candidate(c) for c in candidates):
                raise OptionValueError(f"candidates={list(candidates)!r}; choose from {AUTO_CANDIDATES} (or "
                                       "'selective:' with another named policy, e.g. 'selective:attention+fc2')")
            object.__setattr__(self, "candidates", candidates)

    def manager_fields_set(self) -> list:
        return [name for name in self.manager_fields if getattr(self, name) != getattr(type(self), name)]


# The table of modes: each mode's name is its options class's `mode_name`; the names trainer configs
# use are aliases of them (aliases.py). apply(), OffloadCallback, gradient_checkpointing_enable,
# compile, offload_activations, integrations.from_config and the bench CLI look names up here.
MODE_OPTIONS = (HiddenStatesOptions, SelectiveOptions, ActivationsOptions, SyncOptions, DiskOptions, ModulesOptions,
                AutoOptions)
OPTIONS_BY_NAME = {options.mode_name: options for options in MODE_OPTIONS}


def mode_names() -> tuple:
    """Every name a mode is asked for by: the modes' own, then the aliases that are strings."""
    return tuple(OPTIONS_BY_NAME) + tuple(alias for alias in ALIASES if isinstance(alias, str))


def canonical_mode(mode) -> Optional[str]:
    """The mode's own name for `mode` (a name in any case, an alias, True), or None for None. Raises
    ValueError naming the modes for anything else."""
    if mode is None:
        return None
    name = unalias(mode)
    if isinstance(name, str) and name in OPTIONS_BY_NAME:
        return name
    raise ValueError(f"unknown mode {mode!r}; expected one of {mode_names()} or None")


def options_type(mode):
    """The options class of `mode` (any name canonical_mode takes)."""
    return OPTIONS_BY_NAME[canonical_mode(mode)]


def options_taken_by() -> dict:
    """option name -> the modes that take it (for "x is for mode='selective'")."""
    taken = {}
    for options in MODE_OPTIONS:
        for field in dataclasses.fields(options):
            taken.setdefault(field.name, []).append(options.mode_name)
    return taken


__all__ = ["AUTO_CANDIDATES", "ManagerOptions", "ActivationsOptions", "AutoOptions", "DiskOptions",
           "HiddenStatesOptions", "MODE_OPTIONS", "ModulesOptions", "OPTIONS_BY_NAME",
           "SelectiveOptions", "SyncOptions", "canonical_mode", "is_auto_candidate", "mode_names", "options_taken_by",
           "options_type"]
