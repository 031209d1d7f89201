"""torch_offload/integrations/: Hugging Face gradient checkpointing, Trainer and TRL callbacks,
accelerate, config values."""
