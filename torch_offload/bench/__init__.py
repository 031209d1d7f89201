"""`python -m torch_offload.bench` (console script `torch-offload-bench`): tokens/s, speed against
torch's gradient checkpointing, peak memory, bytes moved and waits of each mode, and of
transformers' own offloading checkpoint, on a random-init Llama at the sequence lengths asked for.
`--help` lists the variants and options (__main__.py)."""
