"""OffloadCallback: a Hugging Face TrainerCallback that turns offloading on when training begins
(on the model the Trainer trains, after its own setup: accelerate's prepare, gradient checkpointing)
and undoes it when training ends. Works with any Trainer subclass (TRL's SFTTrainer included).

Two routes: apply(model, mode, **options) (any mode; the model's own gradient checkpointing is turned
off, ours replaces it), or with hf_checkpointing=True the Trainer's own gradient checkpointing
(TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs=...)) running
torch_offload's checkpoint, its keywords and every_n_layers kept (hf_checkpointing.take_over).
"""
import warnings
from typing import Optional

from transformers import TrainerCallback

from ..apply import apply, read_options
from ..handle import OffloadHandle
from .trainer_config import from_config
from .hf_checkpointing import OFFLOAD_REFUSED, check_options, take_over

# Options that mean something on the other route.
_HF_ROUTE_HINTS = {
    "every_n_layers": "with hf_checkpointing=True it comes from TrainingArguments(gradient_checkpointing_kwargs="
                      "{'every_n_layers': n})",
    "gradient_checkpointing_kwargs": "with hf_checkpointing=True they come from TrainingArguments("
                                     "gradient_checkpointing_kwargs=...)",
    "use_reentrant": "with hf_checkpointing=True it comes from TrainingArguments(gradient_checkpointing_kwargs="
                     "{'use_reentrant': True})",
}


class OffloadCallback(TrainerCallback):
    """callbacks=[OffloadCallback("hidden_states")]: apply(model, mode, **options) for the run.

    `mode` and options as for torch_offload.apply (e.g. OffloadCallback("all", min_bytes=0),
    OffloadCallback(None, layer_offloading=True), or an OffloadConfig), checked when the callback is
    made: a wrong mode or option raises here, naming it. hf_checkpointing=True (modes
    "hidden_states" and "selective"): the Trainer's own gradient checkpointing
    (TrainingArguments(gradient_checkpointing=True)) runs torch_offload's checkpoint, with
    TrainingArguments' gradient_checkpointing_kwargs and every_n_layers; options as for
    integrations.gradient_checkpointing_enable. `config` is the OffloadConfig the run applies;
    `handle` is the handle while training runs (stats()); `stats` keeps the last run's statistics
    after it ended.
    """

    def __init__(self, mode="hidden_states", *, hf_checkpointing: bool = False, **options):
        if not isinstance(hf_checkpointing, bool):
            raise TypeError(f"torch_offload.integrations.OffloadCallback: hf_checkpointing={hf_checkpointing!r}; "
                            "expected True or False")
        name = "torch_offload.integrations.OffloadCallback"
        self.mode, self.hf_checkpointing, self.options = mode, hf_checkpointing, options
        self.handle: Optional[OffloadHandle] = None
        self.stats: dict = {}
        self.config = None
        if hf_checkpointing:
            self._call = f"{name}(mode={mode!r}, hf_checkpointing=True)"
            options_only = {k: v for k, v in options.items() if k != "manager"}
            check_options(mode, options_only, self._call, options.get("manager"), _HF_ROUTE_HINTS)
            return
        self.config, self._call = read_options(mode, options, name)

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
            self.handle = None
        checkpoint_kwargs = getattr(args, "gradient_checkpointing_kwargs", None) or {}
        if self.hf_checkpointing:
            if isinstance(checkpoint_kwargs, dict) and checkpoint_kwargs.get("offload"):
                raise ValueError(f"{self._call}: TrainingArguments(gradient_checkpointing_kwargs=...) has "
                                 f"offload=True: {OFFLOAD_REFUSED}")
            # The Trainer enabled checkpointing with args' keywords (every_n_layers and offload taken out,
            # TRL's additions put in): take_over keeps those it installed.
            self.handle = take_over(model, self.mode, self._call,
                                    "TrainingArguments.gradient_checkpointing_kwargs (as the model's gradient "
                                    "checkpointing runs them)", **self.options)
            return
        if (self.config.mode_name in ("hidden_states", "selective") and checkpoint_kwargs
                and getattr(args, "gradient_checkpointing", False)):
            warnings.warn(f"{self._call}: apply() replaces the model's gradient checkpointing with its own, so "
                          f"TrainingArguments(gradient_checkpointing_kwargs={checkpoint_kwargs!r}) is not used; "
                          f"OffloadCallback({self.config.mode_name!r}, hf_checkpointing=True) runs the Trainer's "
                          "checkpointing with them")
        self.handle = apply(model, self.config, self.options.get("blocks"), self.options.get("manager"))

    def on_train_end(self, args, state, control, **kwargs):
        if self.handle is not None:
            self.stats = self.handle.stats()
            self.handle.remove()
            self.handle = None


def enable(trainer, mode="hidden_states", **options) -> OffloadCallback:
    """Adds an OffloadCallback(mode, **options) to a built Trainer (hf_checkpointing=True too);
    returns the callback."""
    callback = OffloadCallback(mode, **options)
    trainer.add_callback(callback)
    return callback
