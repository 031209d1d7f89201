"""Turning offloading on where users train: Hugging Face Trainer / TRL SFTTrainer (a callback),
models prepared by accelerate, and the values axolotl and TRL configs use for the mode.

    trainer = Trainer(..., callbacks=[torch_offload.integrations.OffloadCallback("hidden_states")])
    torch_offload.integrations.enable(trainer, "all", min_bytes=0)      # or on a built trainer
    handle = torch_offload.integrations.apply_prepared(accelerator.prepare(model), "hidden_states")

Importing this package imports transformers (for TrainerCallback); `import torch_offload` does not.
"""
from .accelerate_model import apply_prepared, unwrap
from .config import from_config
from .hf_trainer import OffloadCallback, enable

__all__ = ["OffloadCallback", "apply_prepared", "enable", "from_config", "unwrap"]
