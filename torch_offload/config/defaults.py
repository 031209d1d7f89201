"""The defaults of the options, each declared once (the option dataclasses, offload_activations,
offload_modules, offload_layers and selective_checkpoint read them here); the manager's own come from
the engine, where csrc/manager_config.h declares them."""
from .._engine.manager import MANAGER_DEFAULTS

MAX_IN_FLIGHT = MANAGER_DEFAULTS.max_in_flight  # device-to-host copies in flight before a save waits
ACTIVATIONS_MIN_BYTES = 1 << 20  # modes "all", "sync", "disk", "modules": smaller saves stay on the device
SELECTIVE_MIN_BYTES = 1 << 16  # mode "selective": smaller op outputs (dropout seeds, empty masks) stay
# Mode "modules": copies restored ahead of need in backward. A selected attention saves 5-6 copies
# per layer, so with 4 each layer's first restore was issued on demand; 8 was the fastest of 4 / 8 /
# 16 / 32 on the reference model (docs/performance.md, "modules"), and the peak does not depend on it
# (it comes at the end of forward).
MODULES_PREFETCH_DEPTH = 8
