"""keep_on_device_bytes="auto" for the modes that offload without recompute ("all", "modules"): a
byte budget per step for the device-to-host link.

A forward saves B bytes and computes for T seconds; while it computes, the link carries about
bandwidth x T of them. What it cannot carry stalls the forward (the host waits on the bound of
copies in flight) or is still queued when backward starts, and backward needs the newest saves
first, so it waits for their copies out and back. After each training step the manager's window of
saves kept on the GPU (OffloadManager.set_keep_on_device_bytes, csrc/device_window.h) is set to
that excess, B - bandwidth x T, plus a margin: the newest saves of the next forward stay where they
are and never cross the link. It costs that much GPU memory at the turn from forward to backward:
where the link is far slower than the forward (offloading everything at short sequences), most of
the saves stay, and the step runs near the speed, and the memory, of no offloading.
T is the forward's time (CUDA events around the model's forward, read at the next step, so no step
waits for them) less the time the host was blocked on copies in flight during it (the manager's
host_wait_ms); B comes from the manager's counters; the bandwidth is measured once per device (a
pinned copy of 256 MiB). Nothing happens on CPU or in eval / no-grad forwards.
"""
import torch
from torch import nn

MARGIN = 1.1
_bandwidth = {}  # device index -> measured device-to-host bytes/s


def window_for(forward_bytes: float, forward_s: float, stalled_s: float, bandwidth: float) -> int:
    """The bytes of a forward's saves that the link cannot carry while the forward computes (its
    time less the time it stalled on copies; 0: all of them)."""
    excess = forward_bytes - bandwidth * max(0.0, forward_s - stalled_s)
    return int(excess * MARGIN) if excess > 0 else 0


def d2h_bandwidth(device: torch.device) -> float:
    """Device-to-pinned-host copy bandwidth in bytes/s, measured once per device (best of 3)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _bandwidth:
        src = torch.empty(256 << 20, dtype=torch.uint8, device=torch.device("cuda", index))
        dst = torch.empty(src.shape, dtype=torch.uint8, pin_memory=True)
        best = float("inf")
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        _bandwidth[index] = src.numel() / best
    return _bandwidth[index]


class LinkBudget:
    """Sizes `manager`'s window from each training forward (watch() installs it on a model).
    `history`: (bytes saved, forward seconds, seconds the host stalled on copies, window set) per
    measured step; `window`: the last."""

    def __init__(self, manager):
        self.manager = manager
        self.window = 0
        self.history = []
        self._start = None  # (start event, manager bytes at the start, device) of a forward under way
        self._pending = None  # (start event, end event, bytes saved, seconds stalled, device) of the last forward

    def watch(self, model: nn.Module) -> list:
        """Forward pre-hook and hook on `model`; returns their handles."""
        return [model.register_forward_pre_hook(self._before), model.register_forward_hook(self._after)]

    def _counters(self) -> tuple:
        """(bytes that entered the engine, host seconds blocked on copies in flight), cumulative."""
        stats = self.manager.stats()
        return stats["bytes_to_host"] + stats["window_bytes"], stats["host_wait_ms"] / 1e3

    def _before(self, module, args):
        self._start = None
        device = next((p.device for p in module.parameters() if p.is_cuda), None)
        if device is None or not (module.training and torch.is_grad_enabled()):
            return
        self._settle()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        self._start = (start, self._counters(), device)

    def _after(self, module, args, output):
        if self._start is None:
            return
        start, (bytes_before, wait_before), device = self._start
        self._start = None
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        bytes_after, wait_after = self._counters()
        self._pending = (start, end, bytes_after - bytes_before, wait_after - wait_before, device)

    def _settle(self):
        """Sets the window from the previous forward (its backward has run since)."""
        if self._pending is None:
            return
        start, end, saved, stalled, device = self._pending
        self._pending = None
        end.synchronize()  # recorded a whole backward ago: done
        seconds = start.elapsed_time(end) / 1e3
        self.window = window_for(saved, seconds, stalled, d2h_bandwidth(device))
        self.manager.set_keep_on_device_bytes(self.window)
        self.history.append((saved, seconds, stalled, self.window))


def watch_link(handle, model: nn.Module, sized_from_link: bool) -> None:
    """With keep_on_device_bytes="auto" (`sized_from_link`): handle.link_budget sizes the manager's
    window after each training step."""
    if sized_from_link:
        handle.link_budget = LinkBudget(handle.manager)
        handle.on_remove(*handle.link_budget.watch(model))
