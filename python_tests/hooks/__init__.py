"""torch_offload/hooks/: the saved-tensor hooks (offload_hooks.py) and what they use: saved
regions, the save filter, the C save hooks, deferred saves, empty-step warnings."""
