"""torch_offload/tiling/: sequence-tiled MLPs."""
