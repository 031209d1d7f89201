"""torch_offload/checkpointing/: checkpoint() against torch's, the non-reentrant and reentrant
variants, torch's own checkpoint tests."""
