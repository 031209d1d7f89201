"""The planner of mode="auto": measures our checkpoint-replacing modes on the first training steps, on this machine
and this model, and keeps the fastest whose peak memory fits a budget.

Candidates: "hidden_states", "selective:attention", "selective:attention+qkv+out_proj" (only when
the blocks have those projections; `candidates=` also takes any other "selective:<named policy>")
and "checkpointing" (torch's own, nothing offloaded: where the step is bound by the host, e.g. short
sequences, it can be the fastest, and auto should never lose to it). use_reentrant=True runs every
candidate in its reentrant variant (ours and torch's), with "+fc2" added to the
policies with projection groups. They all train exactly like gradient checkpointing (fp32
gradients bit-equal), so the trial steps are ordinary training steps. A step is one forward of the
model in training mode with grad enabled, and what follows it until the next such forward (its
backward, the optimizer). Each candidate runs `trial_steps` steps (default 3): the first warms the
allocator, the pinned pool and the kernels, the others are timed (the fastest counts: a step slowed
by something else on the machine says nothing of the candidate) and their peak allocated memory read
(the highest counts). The budget,
`memory_budget_gb` (default: gradient checkpointing's peak, measured in its trial; without that
candidate, estimated as the peak under hidden_states plus the block inputs it kept in host memory),
rules out candidates above it (if none
fits, the one with the lowest peak is kept, with a warning); the fastest remaining one stays for the
rest of training. `handle.plan` lists what was measured and chosen; `handle.explain()` gives it as a
table. On CPU there is no peak to read and the budget is not checked.

Memory the budget leaves over is spent on the link: the fastest offloading candidates that fit
(those within 3% of the fastest, at most two) run once more with the newest saves kept on the GPU
(OffloadManager's keep_on_device_bytes: two blocks' offloaded bytes, within the room under the
budget until the last blocks' backward, the early peak of tail.py; predicted peak = the
candidate's early peak plus the kept bytes, or its peak where that is higher). A forward's last
saves, which backward needs first, then never cross the link: where the link is full at the end of
the forward (16k, "attention+qkv+out_proj") that is a visible share of the step
(docs/performance.md). A kept trial whose peak
exceeds the budget runs once more with the window shrunk by the excess.

Then per block (tail.py): the fastest row so far runs with its last blocks not checkpointed at
all (an "unchecked tail": they keep every activation and skip their recompute), where the memory
until those blocks' backward, measured in its trial (the early peak), leaves room under the budget:
first one block, then as many as the room takes by the footprint measured, fewer if the peak went
over, one more for part of the window where that makes the room (at most TAIL_TRIES trials). Where
the peak comes at the end of backward (the gradients of a large model) that room is large. The
fastest row within the budget is kept, as for the candidates.

Then per block again (kept.py): the fastest selective row without a tail runs with its last
blocks keeping their MLP's up/gate products on the device ("+keep_fc1"), as many blocks as the early
phase's room takes (at most KEPT_TRIES trials): that spares most of what a selective block still
recomputes at about a third of an unchecked block's memory.

While it plans, auto synchronises the device and resets its peak-memory statistics at each step.
"""
import functools
import time
import warnings
from typing import List, Optional

import torch
from torch import nn

from ...handle import OffloadHandle
from ...policies.store import bytes_kept
from .kept import can_keep_mlp, next_kept_trial
from .tail import TailProbe, next_tail_trial

GB = 1e9
KEEP_MARGIN = 0.1  # of the room under the budget, left for what the peak does not show exactly
KEEP_TRY_WITHIN = 0.03  # candidates this close to the fastest are tried with a window too
KEEP_TRIES = 2


def keep_on_device_bytes_for(budget_gb: float, peak_gb: float, per_block_bytes: float) -> int:
    """The window of saves kept on the device for a candidate that peaks at `peak_gb` and offloads
    `per_block_bytes` per block: two blocks' worth, within the room under the budget (less than
    one block's worth keeps only part of the last block: 0, not worth a trial)."""
    keep = min(int((budget_gb - peak_gb) * (1 - KEEP_MARGIN) * GB), int(2 * per_block_bytes))
    return keep if keep >= per_block_bytes > 0 else 0


def _early_peak(row: dict) -> float:
    """The peak until the last blocks' backward (what a window adds to), else the step's peak."""
    early = row.get("early_peak_GB")
    return early if early is not None else row["peak_allocated_GB"]


class AutoHandle(OffloadHandle):
    """The handle of mode="auto": the mode in use (`current`), the measurements (`plan`)."""

    def __init__(self, model, blocks, options, install):
        super().__init__(model, "auto", None)
        # `options`: AutoOptions, its candidates filled in; `install(candidate, keep_on_device_bytes,
        # tail, kept_blocks)`: the candidate's handle, installed (candidates.install_candidate).
        self._blocks, self._install = blocks, install
        self._candidates, self._trial_steps, self._budget_gb = options.candidates, options.trial_steps, options.memory_budget_gb
        self.plan: List[dict] = []
        self.planned = False
        self.budget_gb: Optional[float] = options.memory_budget_gb
        self.chosen: Optional[str] = None
        self.keep_on_device_bytes = 0  # of the chosen row
        self.tail_blocks = 0  # of the chosen row: its last blocks that run unchecked
        self.kept_mlp_blocks = 0  # of the chosen row: its last blocks that keep their up/gate products
        # (candidate, keep_on_device_bytes, tail, kept_mlp_blocks) to measure
        self._trials = [(c, 0, 0, 0) for c in self._candidates]
        self._tails_done = False
        self._trial = 0  # index into _trials
        self._round = 0  # rounds of further trials queued: 1 windows, 2 smaller windows, 3+ tails
        self._probe: Optional[TailProbe] = None
        self._steps = 0  # steps finished under the current candidate
        self._timed = []  # (seconds, peak allocated GB, bytes to host, early peak GB, bytes kept) of its timed steps
        self._started: Optional[float] = None
        self.current: Optional[OffloadHandle] = None  # the candidate's handle in use
        self._switch(*self._trials[0])
        self.on_remove(model.register_forward_pre_hook(self._on_forward))

    @property
    def blocks(self) -> List[nn.Module]:
        return self.current.blocks if self.current is not None else []

    def stats(self) -> dict:
        return self.current.stats() if self.current is not None else {}

    def remove(self) -> None:
        self._remove_probe()
        if self.current is not None:
            self.current.remove()
            self.current = None
        super().remove()

    def explain(self) -> str:
        """The plan as a markdown table: each candidate's measured step and peak, and the choice."""
        budget = f"{self.budget_gb:.2f} GB" if self.budget_gb is not None else "not checked"
        def gb(value):
            return "-" if value is None else f"{value:.2f}"

        lines = [f"torch_offload mode='auto' (budget: {budget})", "",
                 "| candidate | kept on GPU GB | unchecked last blocks | last blocks keeping up/gate | step s "
                 "| predicted peak GB | early peak GB | peak allocated GB | within budget | chosen |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for row in self.plan:
            lines.append(f"| {row['candidate']} | {gb(row['keep_on_device_GB'])} | {row['tail_blocks']} | "
                         f"{row['kept_mlp_blocks']} | "
                         f"{row['step_s']:.4f} | {gb(row.get('predicted_peak_GB'))} | {gb(row.get('early_peak_GB'))} | "
                         f"{gb(row.get('peak_allocated_GB'))} | {row['within_budget']} | {row['chosen']} |")
        text = "\n".join(lines) + "\n"
        return text if self.long_context is None else text + "\n" + self.long_context.explain()

    def _switch(self, candidate: str, keep_on_device_bytes: int = 0, tail: int = 0, kept_blocks: int = 0) -> None:
        self._remove_probe()
        if self.current is not None:
            old = self.current.manager
            self.current.remove()
            if old is not None:
                old.synchronize()
                old.empty_pool()  # its pinned buffers, before the next candidate's pool fills
        self.current = self._install(candidate, keep_on_device_bytes, tail, kept_blocks)
        self.manager = self.current.manager
        if not self.planned and torch.cuda.is_available():
            n = len(self._blocks)  # the early phase ends with the last checkpointed block's backward
            self._probe = TailProbe(self._blocks[n - 1 - tail], self._blocks[n - tail:] if tail else ())

    def _remove_probe(self) -> None:
        if self._probe is not None:
            self._probe.remove()
            self._probe = None

    def _on_forward(self, module, args):
        if self.planned or not (module.training and torch.is_grad_enabled()):
            return
        cuda = torch.cuda.is_available() and any(p.is_cuda for p in module.parameters())
        if self._started is not None:
            self._finish_step(cuda)
        if self.planned:
            return
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._bytes_before = self.current.stats().get("bytes_to_host", 0)
        self._kept_before = bytes_kept()
        self._started = time.perf_counter()

    def _finish_step(self, cuda: bool) -> None:
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - self._started
        self._started = None
        self._steps += 1
        if self._steps > 1 or self._trial_steps == 1:  # the first of several warms up
            probe = self._probe
            self._timed.append((seconds, torch.cuda.max_memory_allocated() / GB if cuda else None,
                                self.current.stats().get("bytes_to_host", 0) - self._bytes_before,
                                probe.early_peak_gb if cuda and probe is not None else None,
                                bytes_kept() - self._kept_before))
            if probe is not None:
                probe.early_peak_gb = None
        if self._steps < self._trial_steps:
            return
        candidate, keep, tail, kept_blocks = self._trials[self._trial]
        row = {"candidate": candidate, "keep_on_device_bytes": keep, "keep_on_device_GB": keep / GB,
               "tail_blocks": tail, "kept_mlp_blocks": kept_blocks, "kept_GB": self._timed[-1][4] / GB,
               "step_s": min(t[0] for t in self._timed),
               "steps_s": [t[0] for t in self._timed], "bytes_to_host": self._timed[-1][2]}
        if cuda:
            row["peak_allocated_GB"] = max(t[1] for t in self._timed)
            early = [t[3] for t in self._timed if t[3] is not None]
            row["early_peak_GB"] = max(early) if early else None
            if tail and self._probe is not None:
                row["tail_block_GB"] = self._probe.block_gb
            if keep and not tail and not kept_blocks:  # the candidate's own early peak plus what the window keeps
                alone = self._without_window(candidate)
                row["predicted_peak_GB"] = max(alone["peak_allocated_GB"], _early_peak(alone) + keep / GB)
        self.plan.append(row)
        self._timed = []
        self._trial += 1
        self._steps = 0
        if self._trial == len(self._trials):
            self._find_budget()
            while self._trial == len(self._trials) and self._queue_more_trials():
                pass
        if self._trial < len(self._trials):
            self._switch(*self._trials[self._trial])
        else:
            self._decide()

    def _queue_more_trials(self) -> bool:
        """Queues the next round of trials (windows, smaller windows, unchecked tails, then kept
        up/gate products); False when no round is left."""
        if self.budget_gb is None or any("peak_allocated_GB" not in r for r in self.plan):
            return False
        self._round += 1
        if self._round <= 2:
            self._plan_keep_trials()
            return True
        trial = None if self._tails_done else self._next_tail_trial()
        if trial is None:
            self._tails_done = True
            eligible = functools.partial(can_keep_mlp, self._blocks)
            trial = next_kept_trial(self.plan, self.budget_gb, len(self._blocks), eligible)
        if trial is None:
            return False
        self._trials.append(trial)
        return True

    def _next_tail_trial(self):
        device_gb = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / GB
        trial = next_tail_trial(self.plan, self.budget_gb, len(self._blocks), device_gb)
        return trial + (0,) if trial is not None else None

    def _plan_keep_trials(self) -> None:
        """Queues trials of the fastest fitting offloading candidates (those within KEEP_TRY_WITHIN
        of the fastest, at most KEEP_TRIES) with the newest saves kept on the GPU: a window of two
        blocks' offloaded bytes, within the room under the budget. Then, once, a smaller window for
        a kept trial whose peak went over."""
        if self._round == 1:
            fitting = sorted((r for r in self.plan if r["peak_allocated_GB"] <= self.budget_gb),
                             key=lambda r: r["step_s"])
            if not fitting:
                return
            tries = [r for r in fitting if r["step_s"] <= fitting[0]["step_s"] * (1 + KEEP_TRY_WITHIN)
                     and r["candidate"] != "checkpointing" and r["bytes_to_host"]][:KEEP_TRIES]
            for row in tries:
                keep = keep_on_device_bytes_for(self.budget_gb, _early_peak(row), self._per_block_bytes(row))
                if keep:
                    self._trials.append((row["candidate"], keep, 0, 0))
        elif self._round == 2:
            for row in [r for r in self.plan if r["keep_on_device_bytes"] and r["peak_allocated_GB"] > self.budget_gb]:
                excess = row["peak_allocated_GB"] - self.budget_gb
                keep = int(row["keep_on_device_bytes"] - excess * GB * (1 + KEEP_MARGIN))
                if keep > 0 and keep >= self._per_block_bytes(self._without_window(row["candidate"])):
                    self._trials.append((row["candidate"], keep, 0, 0))

    def _without_window(self, candidate: str) -> dict:
        """The plan's row of `candidate` measured without a window."""
        return next(r for r in self.plan if r["candidate"] == candidate and not r["keep_on_device_bytes"]
                    and not r["tail_blocks"] and not r["kept_mlp_blocks"])

    def _per_block_bytes(self, row: dict) -> float:
        return row["bytes_to_host"] / max(1, len(self._blocks))

    def _find_budget(self) -> None:
        measured = [r for r in self.plan if "peak_allocated_GB" in r]
        if self.budget_gb is None and measured:
            # Gradient checkpointing's peak: measured when it was a candidate, else estimated as ours
            # under hidden_states plus the block inputs it kept off the GPU.
            by_name = {r["candidate"]: r for r in measured}
            if "checkpointing" in by_name:
                self.budget_gb = by_name["checkpointing"]["peak_allocated_GB"]
            elif "hidden_states" in by_name:
                hs = by_name["hidden_states"]
                self.budget_gb = hs["peak_allocated_GB"] + hs["bytes_to_host"] / GB

    def _decide(self) -> None:
        for row in self.plan:
            peak = row.get("peak_allocated_GB")
            row["within_budget"] = None if peak is None or self.budget_gb is None else peak <= self.budget_gb
            row["chosen"] = False
        fitting = [r for r in self.plan if r["within_budget"] is not False]
        if not fitting:
            warnings.warn(f"torch_offload mode='auto': no candidate's peak fits memory_budget_gb="
                          f"{self.budget_gb:.2f}; keeping the one with the lowest peak")
            fitting = [min(self.plan, key=lambda r: r["peak_allocated_GB"])]
        best = min(fitting, key=lambda r: r["step_s"])
        best["chosen"] = True
        self.chosen = best["candidate"]
        self.keep_on_device_bytes = best["keep_on_device_bytes"]
        self.tail_blocks = best["tail_blocks"]
        self.kept_mlp_blocks = best["kept_mlp_blocks"]
        self.planned = True
        self._remove_probe()
        chosen = (self.chosen, self.keep_on_device_bytes, self.tail_blocks, self.kept_mlp_blocks)
        if chosen != self._trials[-1]:
            self._switch(*chosen)
