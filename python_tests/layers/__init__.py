"""torch_offload/layers/: frozen-weight (layer) offloading."""
