"""ManagerOptions: the fields of a mode's options that configure its OffloadManager."""
import dataclasses
from typing import Optional, Union

from .defaults import MAX_IN_FLIGHT
from .errors import OptionValueError, check_int


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

    max_in_flight: int = MAX_IN_FLIGHT
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
                      disk_direct_io=self.disk_direct_io, keep_on_device_bytes=self.keep_on_device_bytes)
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
                      "disk_direct_io", "keep_on_device_bytes")
