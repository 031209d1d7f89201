"""The controller of mode="auto": measures the checkpointing modes on the first training steps, on this
machine and this model, and keeps the fastest whose peak memory fits a budget.

Candidates: "hidden_states", "selective:attention", "selective:attention+qkv+out_proj" (only when
the blocks have those projections; `candidates=` also takes any other "selective:<named policy>")
and "checkpointing" (torch's own, nothing offloaded: where the step is bound by the host, e.g. short
sequences, it can be the fastest, and auto should never lose to it). use_reentrant=True runs every
candidate in its reentrant variant (ours and torch's), with "+fc2" added to the policies with
projection groups. They all train exactly like gradient checkpointing (fp32 gradients bit-equal),
so the trial steps are ordinary training steps. A step is one forward of the model in training mode
with grad enabled, and what follows it until the next such forward (its backward, the optimizer).
Each trial runs `trial_steps` steps (default 3): the first warms the allocator, the pinned pool and
the kernels, the others are timed (the fastest counts: a step slowed by something else on the
machine says nothing of the candidate) and their peak allocated memory read (the highest counts).
The budget, `memory_budget_gb` (default: gradient checkpointing's peak, measured in its trial;
without that candidate, estimated as the peak under hidden_states plus the block inputs it kept in
host memory), rules out trials above it (if none fits, the one with the lowest peak is kept, with a
warning); the fastest remaining one stays for the rest of training. `handle.auto.results` lists what
was measured, `handle.auto.chosen` the trial kept; `handle.explain()` gives them as a table. On CPU
there is no peak to read and the budget is not checked.

The rounds after the candidates (trials.Phase):
- windows: memory the budget leaves over is spent on the link: the fastest offloading candidates
  that fit (those within 3% of the fastest, at most two) run once more with the newest saves kept on
  the GPU (OffloadManager's keep_on_device_bytes: two blocks' offloaded bytes, within the room under
  the budget until the last blocks' backward, the early peak of unchecked_tail.py; predicted peak = the
  candidate's early peak plus the kept bytes, or its peak where that is higher). A forward's last
  saves, which backward needs first, then never cross the link: where the link is full at the end
  of the forward (16k, "attention+qkv+out_proj") that is a visible share of the step
  (docs/performance.md).
- smaller windows: a window whose peak exceeds the budget runs once more, shrunk by the excess.
- unchecked tails (unchecked_tail.py): the fastest result so far runs with its last blocks not checkpointed at
  all, where the room under the budget until those blocks' backward allows, at most TAIL_TRIES
  trials.
- kept products (kept_products.py): the fastest selective result without a tail runs with its last blocks
  keeping their MLP's up/gate products on the device ("+keep_fc1"), at most KEPT_TRIES trials.

Under several ranks each timed step's figures are the highest of all ranks' (a step takes as long
as its slowest rank), so every rank makes the same choice (hooks/node_link.agree).

Each trial is installed on a handle of its own (candidates.install_trial); switching trials removes
the last one's. While it plans, auto synchronises the device and resets its peak-memory statistics
at each step.
"""
import time
import warnings
from typing import Callable, List, Optional

import torch
from torch import nn

from ...hooks.node_link import agree, ranks
from ...policies.store import KeptBytes
from .kept_products import can_keep_mlp, next_kept_trial
from .unchecked_tail import TailProbe, next_tail_trial
from .trials import GB, Phase, Trial, TrialResult, plain_result

KEEP_MARGIN = 0.1  # of the room under the budget, left for what the peak does not show exactly
KEEP_TRY_WITHIN = 0.03  # candidates this close to the fastest are tried with a window too
KEEP_TRIES = 2


def keep_on_device_bytes_for(budget_gb: float, peak_gb: float, per_block_bytes: float) -> int:
    """The window of saves kept on the device for a candidate that peaks at `peak_gb` and offloads
    `per_block_bytes` per block: two blocks' worth, within the room under the budget (less than
    one block's worth keeps only part of the last block: 0, not worth a trial)."""
    keep = min(int((budget_gb - peak_gb) * (1 - KEEP_MARGIN) * GB), int(2 * per_block_bytes))
    return keep if keep >= per_block_bytes > 0 else 0


class _Step:
    """The step being timed: its start and the counters it began with."""

    def __init__(self, stats: dict):
        self.bytes_to_host = stats.get("bytes_to_host", 0)
        self.kept_bytes = stats.get(KeptBytes.STAT, 0)
        self.started = time.perf_counter()


class AutoController:
    """Installs one trial at a time on `blocks` of `handle.model` and, at each training forward,
    finishes the step before; once every round is done, keeps the chosen trial installed.
    `install_trial(trial)`: the trial installed on an OffloadHandle of its own
    (candidates.install_trial)."""

    def __init__(self, handle, blocks: List[nn.Module], options, install_trial: Callable):
        self.model, self.blocks_all, self.options = handle.model, blocks, options
        self._install_trial = install_trial
        self.results: List[TrialResult] = []
        self.phase = Phase.CANDIDATES
        self.budget_gb: Optional[float] = options.memory_budget_gb
        self.chosen: Optional[Trial] = None
        self.current = None  # the installed trial's OffloadHandle
        self._trials = [Trial(candidate) for candidate in options.candidates]
        self._trial = 0  # index into _trials
        self._probe: Optional[TailProbe] = None
        self._timed: List[tuple] = []  # (seconds, peak GB, bytes to host, early peak GB, bytes kept) per timed step
        self._step: Optional[_Step] = None
        self._steps = 0  # steps finished under the current trial
        self._switch(self._trials[0])
        handle.on_remove(self.model.register_forward_pre_hook(self._on_forward))
        handle.push(self.remove)

    @property
    def planned(self) -> bool:
        return self.phase is Phase.DECIDED

    @property
    def manager(self):
        return None if self.current is None else self.current.manager

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

    def explain(self) -> str:
        """The results as a markdown table: each trial's measured step and peak, and the choice."""
        budget = f"{self.budget_gb:.2f} GB" if self.budget_gb is not None else "not checked"

        def gb(value):
            return "-" if value is None else f"{value:.2f}"

        lines = [f"torch_offload mode='auto' (budget: {budget})", "",
                 "| candidate | kept on GPU GB | unchecked last blocks | last blocks keeping up/gate | step s "
                 "| predicted peak GB | early peak GB | peak allocated GB | within budget | chosen |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for r in self.results:
            lines.append(f"| {r.candidate} | {gb(r.keep_on_device_gb)} | {r.tail_blocks} | "
                         f"{r.kept_mlp_blocks} | {r.step_s:.4f} | {gb(r.predicted_peak_gb)} | {gb(r.early_peak_gb)} | "
                         f"{gb(r.peak_allocated_gb)} | {r.within_budget} | {r.chosen} |")
        return "\n".join(lines) + "\n"

    # Trials

    def _switch(self, trial: Trial) -> None:
        self._remove_probe()
        if self.current is not None:
            old = self.current.manager
            self.current.remove()
            self.current = None
            if old is not None:
                old.synchronize()
                old.empty_pool()  # its pinned buffers, before the next trial's pool fills
        self.current = self._install_trial(trial)
        if not self.planned and torch.cuda.is_available():
            n, tail = len(self.blocks_all), trial.tail_blocks  # the early phase ends with the last checkpointed block's backward
            self._probe = TailProbe(self.blocks_all[n - 1 - tail], self.blocks_all[n - tail:] if tail else ())

    def _remove_probe(self) -> None:
        if self._probe is not None:
            self._probe.remove()
            self._probe = None

    def _on_forward(self, module, args):
        if self.planned or not (module.training and torch.is_grad_enabled()):
            return
        cuda = torch.cuda.is_available() and any(p.is_cuda for p in module.parameters())
        if self._step is not None:
            self._finish_step(cuda)
        if self.planned:
            return
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._step = _Step(self.current.stats())

    def _finish_step(self, cuda: bool) -> None:
        if cuda:
            torch.cuda.synchronize()
        step, self._step = self._step, None
        seconds = time.perf_counter() - step.started
        self._steps += 1
        if self._steps > 1 or self.options.trial_steps == 1:  # the first of several warms up
            stats, probe = self.current.stats(), self._probe
            self._timed.append((seconds, torch.cuda.max_memory_allocated() / GB if cuda else None,
                                stats.get("bytes_to_host", 0) - step.bytes_to_host,
                                probe.early_peak_gb if cuda and probe is not None else None,
                                stats.get(KeptBytes.STAT, 0) - step.kept_bytes))
            if probe is not None:
                probe.early_peak_gb = None
        if self._steps < self.options.trial_steps:
            return
        self.results.append(self._result(self._trials[self._trial], cuda))
        self._timed, self._steps = [], 0
        self._trial += 1
        if self._trial == len(self._trials):
            if self.phase is Phase.CANDIDATES:
                self._find_budget()
            self._queue_next_trials()
        if self._trial < len(self._trials):
            self._switch(self._trials[self._trial])
        else:
            self._decide()

    def _result(self, trial: Trial, cuda: bool) -> TrialResult:
        self._timed = timed = self._agreed(self._timed)
        result = TrialResult(trial, step_s=min(t[0] for t in timed), steps_s=[t[0] for t in timed],
                             bytes_to_host=timed[-1][2], kept_gb=timed[-1][4] / GB)
        if cuda:
            result.peak_allocated_gb = max(t[1] for t in timed)
            early = [t[3] for t in timed if t[3] is not None]
            result.early_peak_gb = max(early) if early else None
            if trial.tail_blocks and self._probe is not None:
                result.tail_block_gb = self._probe.block_gb
            if trial.keep_on_device_bytes and not trial.tail_blocks and not trial.kept_mlp_blocks:
                alone = plain_result(self.results, trial.candidate)  # its own early peak plus what the window keeps
                result.predicted_peak_gb = max(alone.peak_allocated_gb,
                                               alone.early_or_peak_gb + trial.keep_on_device_bytes / GB)
        return result

    @staticmethod
    def _agreed(timed: List[tuple]) -> List[tuple]:
        """The timed steps as every rank measured them, the highest figure of all ranks in each field
        (a step takes as long as its slowest rank): every rank then makes the same choice. As they
        are with one rank."""
        if ranks() == 1:
            return timed
        fields = [[(-1.0 if value is None else value) for value in step] for step in timed]
        flat = agree([value for step in fields for value in step], "max")
        width = len(fields[0])
        return [tuple(None if value < 0 else value for value in flat[i * width:(i + 1) * width])
                for i in range(len(fields))]

    def _queue_next_trials(self) -> None:
        """Moves through the rounds until one queues a trial; past the last, the phase stays at
        the choice. Without measured peaks (CPU) there are no rounds after the candidates."""
        if self.budget_gb is None or not all(r.measured for r in self.results):
            return
        while True:
            if self.phase is Phase.CANDIDATES:
                self.phase, trials = Phase.WINDOWS, self._window_trials()
            elif self.phase is Phase.WINDOWS:
                self.phase, trials = Phase.SMALLER_WINDOWS, self._smaller_window_trials()
            elif self.phase in (Phase.SMALLER_WINDOWS, Phase.TAILS):
                trial = self._next_tail_trial()
                self.phase = Phase.TAILS if trial is not None else Phase.KEPT_PRODUCTS
                trials = [trial] if trial is not None else []
            else:
                trial = next_kept_trial(self.results, self.budget_gb, len(self.blocks_all),
                                        lambda candidate: can_keep_mlp(self.blocks_all, candidate))
                if trial is None:
                    return
                trials = [trial]
            if trials:
                self._trials.extend(trials)
                return

    def _next_tail_trial(self) -> Optional[Trial]:
        device_gb = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / GB
        return next_tail_trial(self.results, self.budget_gb, len(self.blocks_all), device_gb)

    def _window_trials(self) -> List[Trial]:
        """The fastest fitting offloading candidates (those within KEEP_TRY_WITHIN of the fastest, at
        most KEEP_TRIES) with the newest saves kept on the GPU: a window of two blocks' offloaded
        bytes, within the room under the budget."""
        fitting = sorted((r for r in self.results if r.peak_allocated_gb <= self.budget_gb), key=lambda r: r.step_s)
        if not fitting:
            return []
        tries = [r for r in fitting if r.step_s <= fitting[0].step_s * (1 + KEEP_TRY_WITHIN)
                 and r.candidate != "checkpointing" and r.bytes_to_host][:KEEP_TRIES]
        trials = []
        for result in tries:
            keep = keep_on_device_bytes_for(self.budget_gb, result.early_or_peak_gb, self._per_block_bytes(result))
            if keep:
                trials.append(Trial(result.candidate, keep))
        return trials

    def _smaller_window_trials(self) -> List[Trial]:
        """A window whose peak went over the budget, shrunk by the excess."""
        trials = []
        for result in [r for r in self.results if r.keep_on_device_bytes and r.peak_allocated_gb > self.budget_gb]:
            excess = result.peak_allocated_gb - self.budget_gb
            keep = int(result.keep_on_device_bytes - excess * GB * (1 + KEEP_MARGIN))
            if keep > 0 and keep >= self._per_block_bytes(plain_result(self.results, result.candidate)):
                trials.append(Trial(result.candidate, keep))
        return trials

    def _per_block_bytes(self, result: TrialResult) -> float:
        return result.bytes_to_host / max(1, len(self.blocks_all))

    def _find_budget(self) -> None:
        measured = [r for r in self.results if r.measured]
        if self.budget_gb is None and measured:
            # Gradient checkpointing's peak: measured when it was a candidate, else estimated as ours
            # under hidden_states plus the block inputs it kept off the GPU.
            by_name = {r.candidate: r for r in measured}
            if "checkpointing" in by_name:
                self.budget_gb = by_name["checkpointing"].peak_allocated_gb
            elif "hidden_states" in by_name:
                hidden = by_name["hidden_states"]
                self.budget_gb = hidden.peak_allocated_gb + hidden.bytes_to_host / GB

    def _decide(self) -> None:
        for result in self.results:
            peak = result.peak_allocated_gb
            result.within_budget = None if peak is None or self.budget_gb is None else peak <= self.budget_gb
            result.chosen = False
        fitting = [r for r in self.results if r.within_budget is not False]
        if not fitting:
            warnings.warn(f"torch_offload mode='auto': no candidate's peak fits memory_budget_gb="
                          f"{self.budget_gb:.2f}; keeping the one with the lowest peak")
            fitting = [min(self.results, key=lambda r: r.peak_allocated_gb)]
        best = min(fitting, key=lambda r: r.step_s)
        best.chosen = True
        self.chosen = best.trial
        self.phase = Phase.DECIDED
        self._remove_probe()
        if best.trial != self._trials[-1]:
            self._switch(best.trial)
