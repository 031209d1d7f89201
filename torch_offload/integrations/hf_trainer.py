"""OffloadCallback: a Hugging Face TrainerCallback that turns offloading on when training begins
(on the model the Trainer trains, after its own setup: accelerate's prepare, gradient checkpointing)
and undoes it when training ends. Works with any Trainer subclass (TRL's SFTTrainer included)."""
from typing import Optional

from transformers import TrainerCallback

from ..apply import OffloadHandle, apply
from .config import from_config


class OffloadCallback(TrainerCallback):
    """callbacks=[OffloadCallback("hidden_states")]: apply(model, mode, **options) for the run.

    `mode` and options as for torch_offload.apply (e.g. OffloadCallback("all", min_bytes=0),
    OffloadCallback(None, layer_offloading=True)). `handle` is the OffloadHandle while training
    runs (stats()); `stats` keeps the last run's statistics after it ended.
    """

    def __init__(self, mode="hidden_states", **options):
        self.mode = mode
        self.options = options
        self.handle: Optional[OffloadHandle] = None
        self.stats: dict = {}

    @classmethod
    def from_config(cls, activation_offloading=None, layer_offloading: bool = False, **options):
        """From axolotl / TRL config values (`activation_offloading: true|legacy|disk|
        hidden_states`, `layer_offloading: true`); see integrations.config."""
        arguments = from_config(activation_offloading, layer_offloading)
        return cls(arguments["mode"], layer_offloading=arguments["layer_offloading"], **options)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("torch_offload.integrations.OffloadCallback: the Trainer passed no model")
        if self.handle is not None:  # a run that ended without on_train_end (an exception)
            self.handle.remove()
        self.handle = apply(model, self.mode, **self.options)

    def on_train_end(self, args, state, control, **kwargs):
        if self.handle is not None:
            self.stats = self.handle.stats()
            self.handle.remove()
            self.handle = None


def enable(trainer, mode="hidden_states", **options) -> OffloadCallback:
    """Adds an OffloadCallback(mode, **options) to a built Trainer; returns the callback."""
    callback = OffloadCallback(mode, **options)
    trainer.add_callback(callback)
    return callback
