"""A warning, once, when a training step offloaded nothing, saying why: every saved tensor was
under min_bytes, or every one was a parameter, buffer or view of one (those stay on the device).
The same warning for the other ways of asking for offloading that can end up moving nothing: layer
offloading of blocks without frozen weights (layers/frozen_weights.py), a compiled graph without
anything to offload (compiler/partitioner.py)."""
import os
import sys
import warnings

import torch
from torch import nn


class NothingOffloadedWarning(UserWarning):
    """Offloading was asked for and nothing was offloaded: a training step under activation
    offloading, layer offloading of blocks without frozen parameters, or a compiled graph."""


# Frames in these packages are skipped: the warning names the user's line that led to it.
_INTERNAL = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                  for module in (sys.modules[__name__.partition(".")[0]], torch))


def warn_nothing_offloaded(message: str) -> None:
    """warnings.warn(message, NothingOffloadedWarning) attributed to the first caller outside
    torch_offload and torch (however deep inside them it is raised: a compiled graph is partitioned
    under torch.compile's frames)."""
    frame, level = sys._getframe(0), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, NothingOffloadedWarning, stacklevel=level)


class StepCounts:
    """What the saved-tensor hooks did with each tensor autograd saved: the Python path's counts here,
    the engine filter's added (pack() counts)."""

    def __init__(self, engine_counts):
        # The engine's counts of the same (a dict, see SaveFilter.counts), added to these.
        self._engine_counts = engine_counts
        self.offloaded = 0
        self.under_min_bytes = 0
        self.largest_under_min_bytes = 0
        self.kept_other = 0  # parameters, buffers, views of them, non-dense tensors
        self.warned = False

    def snapshot(self) -> tuple:
        engine = self._engine_counts()
        return (self.offloaded + engine["offloaded"], self.under_min_bytes + engine["under_min_bytes"],
                self.kept_other + engine["kept_other"])

    def largest_under(self) -> int:
        """The largest tensor kept for being under min_bytes."""
        return max(self.largest_under_min_bytes, self._engine_counts()["largest_under_min_bytes"])

    def warn_if_nothing_offloaded(self, since: tuple, min_bytes: int) -> None:
        offloaded, small, other = (now - before for now, before in zip(self.snapshot(), since))
        if self.warned or offloaded or not (small or other):  # no tensor saved: no grad, eval
            return
        self.warned = True
        if small:
            why = (f"{small} saved tensors were under min_bytes={min_bytes} (the largest: "
                   f"{self.largest_under()} bytes); pass a smaller min_bytes (e.g. "
                   "min_bytes=0) to offload them")
            if other:
                why += f"; {other} more were parameters, buffers or views of them"
        else:
            why = f"all {other} saved tensors were parameters, buffers or views of them (kept)"
        warnings.warn("torch_offload: a training step offloaded nothing: " + why,
                      NothingOffloadedWarning, stacklevel=3)


class _StepWatcher:
    """Forward pre-hook and hook of the model: the hooks' counts before and after each training
    forward. An object holding the hooks (not a closure), so a deep copy of the model watches the
    copy's hooks (copy_and_pickle.py)."""

    def __init__(self, hooks):
        self.hooks = hooks  # offload_activations: .counts and .min_bytes
        self.since = None

    def before(self, module, args):
        self.since = self.hooks.counts.snapshot()

    def after(self, module, args, output):
        start, self.since = self.since, None
        if start is not None and module.training and torch.is_grad_enabled():
            self.hooks.counts.warn_if_nothing_offloaded(start, self.hooks.min_bytes)


def watch_model_steps(model: nn.Module, hooks) -> list:
    """Checks each training forward of `model` (grad enabled) with warn_if_nothing_offloaded of
    `hooks` (offload_activations). Returns the hook handles (remove() them to stop)."""
    watcher = _StepWatcher(hooks)
    return [model.register_forward_pre_hook(watcher.before), model.register_forward_hook(watcher.after)]
