"""The defaults of the options the Python package decides, each declared once (the option
dataclasses, offload_activations, offload_modules and selective_checkpoint read them here). The
manager's own (max_in_flight, ...) are the engine's, declared in csrc/manager_config.h and read as
_library.manager.MANAGER_DEFAULTS."""
ACTIVATIONS_MIN_BYTES = 1 << 20  # modes "all", "sync", "disk", "modules": smaller saves stay on the device
SELECTIVE_MIN_BYTES = 1 << 16  # mode "selective": smaller op outputs (dropout seeds, empty masks) stay
# Mode "modules": copies restored ahead of need in backward. A selected attention saves 5-6 copies
# per layer, so with 4 each layer's first restore was issued on demand; 8 was the fastest of 4 / 8 /
# 16 / 32 on the reference model (docs/performance.md, "modules"), and the peak does not depend on it
# (it comes at the end of forward).
MODULES_PREFETCH_DEPTH = 8
