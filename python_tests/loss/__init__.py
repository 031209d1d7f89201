"""torch_offload/loss/: the chunked causal-LM loss."""
