"""mode="auto": the first training steps try the checkpointing modes on this machine and this model
and keep the fastest whose peak memory fits a budget (controller.py); candidates.py resolves each
trial to the options of the mode it names and installs it through that mode's installer; unchecked_tail.py
and kept_products.py plan the trials that spend the memory left under the budget per block; trials.py holds
the trials, their results and the rounds."""
import dataclasses
import functools

from ..installer import ModeInstaller
from .candidates import default_candidates, install_trial
from .controller import AutoController


class Auto(ModeInstaller):
    def __init__(self, installer_for):
        # installer_for(mode options) -> the ModeInstaller that installs a trial's options.
        self.installer_for = installer_for

    def install(self, handle, blocks, options, manager=None) -> None:
        if options.candidates is None:
            options = dataclasses.replace(options, candidates=tuple(default_candidates(blocks, options.use_reentrant)))
        trial = functools.partial(install_trial, self.installer_for, handle.model, blocks, options)
        handle.auto = AutoController(handle, blocks, options, trial)
