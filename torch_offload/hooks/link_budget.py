"""Budgets for the device-to-host link, sized from each training forward.

A forward saves B bytes and computes for T seconds; while it computes, the link carries about
bandwidth x T of them. What it cannot carry stalls the forward (the host waits on the bound of
copies in flight) or is still queued when backward starts, and backward needs the newest saves
first, so it waits for their copies out and back. T is the forward's time (CUDA events around the
model's forward, read at the next step, so no step waits for them) less the time the host was
blocked on copies in flight during it (the manager's host_wait_ms); B comes from the manager's
counters; the bandwidth is this rank's share of the node's link, measured once (hooks/node_link.py).
Nothing happens on CPU or in eval / no-grad forwards. Two budgets:

- LinkBudget, keep_on_device_bytes="auto" (modes "all" and "modules"): after each training step the
  manager's window of saves kept on the GPU (OffloadManager.set_keep_on_device_bytes,
  csrc/device_window.h) is set to the excess, B - bandwidth x T, plus a margin: the newest saves of
  the next forward stay where they are and never cross the link. It costs that much GPU memory at the
  turn from forward to backward: where the link is far slower than the forward (offloading
  everything at short sequences), most of the saves stay, and the step runs near the speed, and the
  memory, of no offloading.
- PolicyLinkBudget, link_throttle (mode "selective"): the block inputs cross the link in any case;
  of the op outputs the policy offloads, only as many blocks' as the rest of the link carries are
  offloaded, the first blocks'; the last blocks recompute theirs, as in "hidden_states" (memory as
  checkpointing's, time of a recompute instead of a wait). All ranks agree on the count. Its T comes
  from a forward in which no block offloads its policy's outputs: what a forward offloads changes
  none of its compute, and with the block inputs alone the link keeps up, so that forward's time is
  the compute's. (The host's stall is not the GPU's: with the link overloaded the host blocks while
  the GPU still computes what it queued, so T less that stall underestimates the compute.)
"""
import torch
from torch import nn

from .node_link import agree, link_bandwidth

MARGIN = 1.1


def window_for(forward_bytes: float, forward_s: float, stalled_s: float, bandwidth: float) -> int:
    """The bytes of a forward's saves that the link cannot carry while the forward computes (its
    time less the time it stalled on copies; 0: all of them)."""
    excess = forward_bytes - bandwidth * max(0.0, forward_s - stalled_s)
    return int(excess * MARGIN) if excess > 0 else 0


def policy_blocks_within(link_bytes: float, boundary_bytes: float, policy_bytes_per_block: float,
                         blocks: int) -> int:
    """How many blocks may offload their policy's outputs when the link carries `link_bytes` during
    the forward and the block inputs take `boundary_bytes` of them."""
    if policy_bytes_per_block <= 0:
        return blocks
    return max(0, min(blocks, int((link_bytes / MARGIN - boundary_bytes) // policy_bytes_per_block)))


class ForwardLink:
    """Measures each training forward of a model (watch() installs it): bytes saved, seconds, seconds
    the host stalled on copies; at the next training forward, decide() sets the budget from them.
    `history`: (bytes saved, forward seconds, seconds stalled, budget set) per measured step."""

    def __init__(self, manager):
        self.manager = manager
        self.history = []
        self._start = None  # (start event, manager counters at the start, device) of a forward under way
        self._pending = None  # (start event, end event, bytes saved, seconds stalled, device) of the last forward

    def watch(self, model: nn.Module) -> list:
        """Forward pre-hook and hook on `model`; returns their handles."""
        return [model.register_forward_pre_hook(self._before), model.register_forward_hook(self._after)]

    def decide(self, saved: float, seconds: float, stalled: float, bandwidth: float):
        """Sets the budget from the last training forward; returns it (for history)."""
        raise NotImplementedError

    @property
    def measuring(self) -> bool:
        """Whether a training forward is being measured."""
        return self._start is not None

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
        """Sets the budget from the previous forward (its backward has run since)."""
        if self._pending is None:
            return
        start, end, saved, stalled, device = self._pending
        self._pending = None
        end.synchronize()  # recorded a whole backward ago: done
        seconds = start.elapsed_time(end) / 1e3
        budget = self.decide(saved, seconds, stalled, link_bandwidth(device))
        self.history.append((saved, seconds, stalled, budget))


class LinkBudget(ForwardLink):
    """keep_on_device_bytes="auto": sizes `manager`'s window from each training forward; `window`:
    the last."""

    def __init__(self, manager):
        super().__init__(manager)
        self.window = 0

    def decide(self, saved, seconds, stalled, bandwidth):
        self.window = window_for(saved, seconds, stalled, bandwidth)
        self.manager.set_keep_on_device_bytes(self.window)
        return self.window


class PolicyLinkBudget(ForwardLink):
    """link_throttle: how many of `blocks` blocks, the first in forward order, offload their policy's
    outputs (`policy_blocks`). The blocks' wrappers report each training call (count_block). Decided
    from two measured forwards, then kept: the first, every block offloading its policy's outputs,
    gives their bytes per block; the second, none offloading them (the probe), the forward's compute
    time; the count is then agreed by all ranks (the smallest)."""

    def __init__(self, manager, blocks: int):
        super().__init__(manager)
        self.blocks = self.policy_blocks = blocks
        self.policy_bytes_per_block = None  # from the first measured forward in which a block offloaded its policy's
        self.decided = False
        self._boundary_bytes = 0  # block inputs offloaded in the forward being measured
        self._policy_calls = 0  # blocks that offloaded their policy's outputs in it
        self._counted = (0, 0)  # the two above, for the last measured forward

    def offloads_policy(self, index: int) -> bool:
        """Whether the block at `index` (forward order) offloads its policy's outputs."""
        return index < self.policy_blocks

    def count_block(self, boundary_bytes: int, offloaded_policy: bool) -> None:
        if self.measuring:
            self._boundary_bytes += boundary_bytes
            self._policy_calls += offloaded_policy

    def _before(self, module, args):
        self._boundary_bytes = self._policy_calls = 0
        super()._before(module, args)

    def _after(self, module, args, output):
        if self.measuring:
            self._counted = (self._boundary_bytes, self._policy_calls)
        super()._after(module, args, output)

    def decide(self, saved, seconds, stalled, bandwidth):
        if self.decided:
            return self.policy_blocks
        boundary, calls = self._counted
        if self.policy_bytes_per_block is None:
            if calls:  # every rank runs the same blocks: all take this branch at the same step
                self.policy_bytes_per_block = max(0.0, saved - boundary) / calls
                self.policy_blocks = 0  # the probe: the next forward offloads the block inputs alone
            return self.policy_blocks
        within = policy_blocks_within(bandwidth * max(0.0, seconds - stalled), boundary,
                                      self.policy_bytes_per_block, self.blocks)
        self.policy_blocks = int(agree([within], "min")[0])
        self.decided = True
        return self.policy_blocks


def watch_link(handle, model: nn.Module, sized_from_link: bool) -> None:
    """With keep_on_device_bytes="auto" (`sized_from_link`): handle.link_budget sizes the manager's
    window after each training step."""
    if sized_from_link:
        handle.link_budget = LinkBudget(handle.manager)
        handle.on_remove(*handle.link_budget.watch(model))
