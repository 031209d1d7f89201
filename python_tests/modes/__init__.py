"""torch_offload/modes/: apply()'s modes and their options."""
