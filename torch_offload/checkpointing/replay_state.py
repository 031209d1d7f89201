"""What a checkpoint's recompute must run under to redo its forward exactly: the RNG states (CPU and
the devices of the tensor arguments) and the autocast settings in force when the forward ran.
Captured when the checkpointed function is called; entered around its recompute. Shared by both of
our checkpoint variants (nonreentrant.py, reentrant.py)."""
import contextlib

import torch
from torch.utils.checkpoint import get_device_states, set_device_states


def _autocast_state(device_type: str):
    """The autocast settings in force now, for the device and for the CPU."""
    def state(kind):
        return dict(enabled=torch.is_autocast_enabled(kind), dtype=torch.get_autocast_dtype(kind),
                    cache_enabled=torch.is_autocast_cache_enabled())
    return state(device_type) if device_type != "cpu" else None, state("cpu")


class ReplayState:
    """The forward's RNG and autocast state (see the module's docstring)."""

    __slots__ = ("device_type", "autocast", "rng")

    def __init__(self, device_type: str, tensors, preserve_rng_state: bool):
        self.device_type = device_type
        self.autocast = _autocast_state(device_type)
        self.rng = None
        if preserve_rng_state:
            devices, states = get_device_states(*tensors) if device_type != "cpu" else ([], [])
            self.rng = (torch.get_rng_state(), devices, states)

    def enter(self, stack: contextlib.ExitStack) -> None:
        """Enters the forward's state on `stack`: RNG states forked and set (restored when the stack
        closes), autocast as in forward (entered only where it differs from now: the usual case, no
        autocast, costs nothing)."""
        if self.rng is not None:
            cpu_state, devices, device_states = self.rng
            stack.enter_context(torch.random.fork_rng(devices=devices, device_type=self.device_type))
            torch.set_rng_state(cpu_state)
            if devices:
                set_device_states(devices, device_states, device_type=self.device_type)
        device_autocast, cpu_autocast = self.autocast
        device_autocast_now, cpu_autocast_now = _autocast_state(self.device_type)
        if device_autocast is not None and device_autocast != device_autocast_now:
            stack.enter_context(torch.amp.autocast(self.device_type, **device_autocast))
        if cpu_autocast != cpu_autocast_now:
            stack.enter_context(torch.amp.autocast("cpu", **cpu_autocast))
