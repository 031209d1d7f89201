"""mode="auto", per block: the last blocks of the model may run without checkpointing at all.

Backward needs the last blocks first, while few parameter gradients exist yet. Where the step's
peak comes later (the gradients of a large model at the end of backward) or earlier (the loss), the
memory between the end of the forward and the last blocks' backward can sit well under the budget.
Blocks that keep every activation there (an "unchecked tail") skip their recompute entirely.

TailProbe measures, on CUDA, in each trial step:
- the early peak: the highest allocated memory from the step's start until the backward of the
  last checkpointed block (the last block without a tail; the one before the tail with one) has
  finished: what a tail and a window of kept saves add to;
- a tail block's footprint: the allocated memory its forward adds (every activation it keeps).
next_tail_trial() turns them, with auto's results, into the next trial.
"""
import math
from typing import Iterable, List, Optional

import torch
from torch import nn

from .trials import GB, Trial, TrialResult
TAIL_MARGIN = 0.1  # of the room under the budget, left for what the measured peaks do not show
TAIL_TRIES = 4  # trials with an unchecked tail, at most


class TailProbe:
    """Forward hooks on the blocks that read the CUDA allocator's statistics (host-side counters,
    no synchronisation; built where CUDA is available). `boundary` is the block whose input gradient
    marks the end of the early phase; `tail` the unchecked blocks whose footprint is measured."""

    def __init__(self, boundary: nn.Module, tail: Iterable[nn.Module]):
        self.early_peak_gb: Optional[float] = None  # of the last step that reached the boundary
        self.block_gb: Optional[float] = None  # the largest tail block's footprint, any step
        self._before = None
        self._handles = [boundary.register_forward_pre_hook(self._on_boundary, with_kwargs=True)]
        for block in tail:
            self._handles.append(block.register_forward_pre_hook(self._on_tail_start))
            self._handles.append(block.register_forward_hook(self._on_tail_end))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _on_boundary(self, module, args, kwargs):
        if not (module.training and torch.is_grad_enabled()):
            return
        x = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.requires_grad), None)
        if x is not None and x.is_cuda:
            x.register_hook(self._on_early_phase_end)

    def _on_early_phase_end(self, grad):
        self.early_peak_gb = torch.cuda.max_memory_allocated() / GB

    def _on_tail_start(self, module, args):
        if module.training and torch.is_grad_enabled():
            self._before = torch.cuda.memory_allocated()

    def _on_tail_end(self, module, args, output):
        if self._before is not None:
            footprint = (torch.cuda.memory_allocated() - self._before) / GB
            self.block_gb = max(self.block_gb or 0.0, footprint)
            self._before = None


def first_tail(budget_gb: float, early_peak_gb: Optional[float], device_gb: float, block_input_gb: float,
               n_blocks: int) -> int:
    """The first tail to try from a row measured without one: 1 block, where the budget's room in
    the early phase takes a block of 16 block inputs and the device's room above the budget one of
    32. A transformer block keeps 20-25 (Llama: 22 at 16k, 25 for the 8B shape; its MLP's
    intermediate products are 2.7-3.5x the hidden size, four of them): with less room than 16 the
    trial would only go over the budget, and the device check keeps a block that keeps more from
    running out of memory before its footprint is known. 0: no tail trial."""
    if early_peak_gb is None or n_blocks < 2 or block_input_gb <= 0:
        return 0
    room = (budget_gb - early_peak_gb) * (1 - TAIL_MARGIN)
    return 1 if room >= 16 * block_input_gb and device_gb - budget_gb >= 32 * block_input_gb else 0


def next_tail(budget_gb: float, tail: int, peak_gb: float, early_peak_gb: Optional[float],
              block_gb: Optional[float], n_blocks: int, tried: Iterable[int]) -> int:
    """The next tail length after a trial with `tail` unchecked blocks that peaked at `peak_gb`
    (`early_peak_gb` before its tail's backward ended): over the budget, fewer blocks by the
    excess; within it, more by the early phase's room. 0: nothing new to try."""
    if not block_gb or block_gb <= 0:
        return 0
    if peak_gb > budget_gb:
        candidate = tail - math.ceil((peak_gb - budget_gb) * (1 + TAIL_MARGIN) / block_gb)
    elif early_peak_gb is not None:
        candidate = tail + math.floor((budget_gb - early_peak_gb) * (1 - TAIL_MARGIN) / block_gb)
    else:
        return 0
    candidate = max(0, min(candidate, n_blocks - 1))  # at least one block stays checkpointed
    return candidate if candidate > 0 and candidate not in set(tried) else 0


def window_for_one_more_block(budget_gb: float, early_peak_gb: Optional[float], block_gb: Optional[float],
                              keep_bytes: int) -> Optional[int]:
    """Where the room left under the budget is short of one more tail block, but would do with part
    of the window: the smaller window. A tail block skips its whole recompute, a window only its
    copies' waits, so a block is worth more than a window of its size. None: no trade."""
    if early_peak_gb is None or not block_gb or keep_bytes <= 0:
        return None
    missing = block_gb - (budget_gb - early_peak_gb) * (1 - TAIL_MARGIN)
    if missing <= 0 or missing * GB > keep_bytes:
        return None
    return int(keep_bytes - missing * GB)


def block_input_gb(results: List[TrialResult], n_blocks: int) -> float:
    """A block input's bytes: what hidden_states offloaded per block, else the least any offloading
    candidate did (an upper bound)."""
    rows = [r for r in results if r.bytes_to_host and not r.keep_on_device_bytes and not r.tail_blocks]
    hidden = [r for r in rows if r.candidate == "hidden_states"]
    return min((r.bytes_to_host / n_blocks for r in hidden or rows), default=0) / GB


def next_tail_trial(results: List[TrialResult], budget_gb: float, n_blocks: int, device_gb: float) -> Optional[Trial]:
    """Auto's next trial with an unchecked tail from its results (with measured peaks), or None: the
    first grows from the fastest result within the budget; the next ones move its length by the room
    or the excess measured, or trade part of the window for a block."""
    tails = [r for r in results if r.tail_blocks]
    if len(tails) >= TAIL_TRIES:
        return None
    if not tails:
        fitting = [r for r in results if r.peak_allocated_gb <= budget_gb]
        if not fitting:
            return None
        base = min(fitting, key=lambda r: r.step_s)
        tail = first_tail(budget_gb, base.early_peak_gb, device_gb, block_input_gb(results, n_blocks), n_blocks)
        return Trial(base.candidate, base.keep_on_device_bytes, tail) if tail else None
    last = tails[-1]
    base = min((r for r in results if not r.tail_blocks and r.candidate == last.candidate), key=lambda r: r.step_s)
    within = last.peak_allocated_gb <= budget_gb
    if within and last.step_s >= base.step_s:
        return None  # the tail does not pay here (a step bound by the host, not by recompute)
    keep = last.keep_on_device_bytes
    tail = next_tail(budget_gb, last.tail_blocks, last.peak_allocated_gb, last.early_peak_gb, last.tail_block_gb,
                     n_blocks, [r.tail_blocks for r in tails])
    if not tail and within and last.tail_blocks + 1 < n_blocks:  # one more block for part of the window
        smaller = window_for_one_more_block(budget_gb, last.early_peak_gb, last.tail_block_gb, keep)
        if smaller is not None:
            tail, keep = last.tail_blocks + 1, smaller
    return Trial(last.candidate, keep, tail) if tail else None
