"""Layer offloading: the frozen weights of each layer live in host memory and visit the GPU only while
the layer runs (frozen_weights.py: offload_layers())."""
