"""`python -m torch_offload.bench` (console script `torch-offload-bench`): tokens/s, speed against
torch's gradient checkpointing, peak memory, bytes moved and waits of each mode on a random-init
Llama, at the sequence lengths asked for. See __main__.py for the options."""
