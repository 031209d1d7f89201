"""keep_layers_that_fit: the layers whose frozen weights stay on the GPU, decided from what the first
step at each input size needed.

Layer offloading copies a layer's frozen weights to the GPU at every visit (its forward and its
recompute). Where the step leaves room on the GPU, that traffic frees nothing anyone needs and only
costs time: the copies share the GPU's memory with the kernels, which run slower while they
stream (docs/performance.md, "Long context"). With keep_layers_that_fit:
- the first step at an input size larger than any before runs with every layer offloaded;
- at the next step's first layer, the room that step left is measured: the GPU's free memory plus
  what PyTorch's allocator holds, less the most it has held (its peak, which covers the measured
  step), less what stayed allocated since that step began (an optimizer's new state), less a margin;
- the layers whose weights fit in that room, first to last, get a device copy of their frozen
  weights made there and then (before the step's activations, so the copies sit beside the model's
  own weights rather than between them), and keep it: their visits copy nothing;
- a larger input drops every kept copy first, then measures again.
The allocator's peak is never reset here (it is the user's statistic), so a peak from earlier, larger
work only makes the room smaller: the choice errs towards offloading. A user's reset of it after
memory went back to the device (torch.cuda.empty_cache() then reset_peak_memory_stats(), between the
two steps) hides the measured step's peak: the room then cannot be known, and the step after it is
measured instead.
"""
from typing import Callable, NamedTuple, Optional

import torch

# Left free on the GPU beside the kept weights: the larger of these.
MARGIN_BYTES = 2 << 30
MARGIN_SHARE = 0.05


class StepStart(NamedTuple):
    """The allocator's state when the measured step began."""
    allocated: int  # bytes allocated
    device_frees: int  # how many times the allocator had given memory back to the device


def step_start(device: torch.device) -> StepStart:
    if device.type != "cuda":
        return StepStart(0, 0)
    return StepStart(torch.cuda.memory_allocated(device), _device_frees(device))


def _device_frees(device: torch.device) -> int:
    return torch.cuda.memory_stats(device).get("num_device_free", 0)


def device_room(device: torch.device, start: StepStart) -> Optional[int]:
    """Bytes more tensors may take on `device` without the next step needing more than the GPU has,
    given what the measured step (begun at `start`) needed; None when that step's peak is lost (see
    the module docstring). Only a CUDA device has a room to measure: elsewhere 0 (keep nothing)."""
    if device.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(device)
    held_now = torch.cuda.memory_reserved(device)
    held_at_peak = torch.cuda.max_memory_reserved(device)
    if held_at_peak <= held_now and _device_frees(device) != start.device_frees:
        # Memory went back to the device during or after the step, yet nothing above what is held
        # now was ever held: the peak was reset after the release.
        return None
    stayed = max(0, torch.cuda.memory_allocated(device) - start.allocated)
    margin = max(MARGIN_BYTES, int(MARGIN_SHARE * total))
    return free + held_now - held_at_peak - stayed - margin


class KeptLayers:
    """Decides, at each step's first layer, which layers keep their device copies (see the module
    docstring). `room(device, start)`: the bytes the kept copies may take, None when unknown
    (default: device_room)."""

    def __init__(self, room: Optional[Callable[[torch.device, StepStart], Optional[int]]] = None):
        self.room = room or device_room
        self.largest_size = 0  # elements of the largest first-layer input seen
        self._measuring_since: Optional[StepStart] = None  # when the measured step began

    def __deepcopy__(self, memo):
        # A copy of the model starts offloaded and measures its own steps.
        return KeptLayers(self.room)

    def at_step_start(self, layers, size: int, device: torch.device) -> None:
        """Called with the first layer's input size (elements) before its forward, outside backward."""
        if size > self.largest_size:
            for layer in layers:
                layer.drop_kept()
            self.largest_size = size
            self._measuring_since = step_start(device)
            return
        if self._measuring_since is None:
            return
        room = self.room(device, self._measuring_since)
        if room is None:  # the measured step's peak is lost: this step is measured instead
            self._measuring_since = step_start(device)
            return
        self._measuring_since = None
        for layer in layers:
            if layer.frozen_bytes > room:
                break
            room -= layer.frozen_bytes
            layer.keep()
