"""Turning offloading on where users train: a Hugging Face model's own gradient checkpointing
(gradient_checkpointing_enable), Hugging Face Trainer / TRL SFTTrainer and PyTorch Lightning
(callbacks), models prepared by accelerate, and the values axolotl and TRL configs use for the mode.

    handle = torch_offload.integrations.gradient_checkpointing_enable(model)   # transformers' terms
    trainer = Trainer(..., callbacks=[torch_offload.integrations.OffloadCallback("hidden_states")])
    torch_offload.integrations.enable(trainer, "all", min_bytes=0)      # or on a built trainer
    handle = torch_offload.integrations.apply_prepared(accelerator.prepare(model), "hidden_states")
    trainer = lightning.Trainer(..., callbacks=[torch_offload.integrations.OffloadLightningCallback()])

The names are loaded on first use: OffloadCallback and enable import transformers (for
TrainerCallback), OffloadLightningCallback imports lightning; `import torch_offload.integrations`
alone imports neither.
"""
import importlib

_WHERE = {"OffloadCallback": "hf_trainer", "enable": "hf_trainer", "apply_prepared": "accelerate_model",
          "unwrap": "unwrapping", "from_config": "trainer_config", "gradient_checkpointing_enable": "hf_checkpointing",
          "HFCheckpointingHandle": "hf_checkpointing", "OffloadLightningCallback": "lightning"}


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'torch_offload.integrations' has no attribute {name!r}")
    value = getattr(importlib.import_module("." + _WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_WHERE))


__all__ = ["HFCheckpointingHandle", "OffloadCallback", "OffloadLightningCallback", "apply_prepared", "enable",
           "from_config", "gradient_checkpointing_enable", "unwrap"]
