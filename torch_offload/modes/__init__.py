"""What each activation mode installs on a model (its options are data: torch_offload/config/).

hidden_states.py and selective.py checkpoint each block with a wrapper of their own; activations.py
("all", "sync", "disk") and modules.py install saved-tensor hooks; auto/ measures trials of the
checkpointing modes. install.py maps each options class to its mode (INSTALLERS)."""
from ..config.mode_options import (ActivationsOptions, ManagerOptions, AutoOptions, DiskOptions, HiddenStatesOptions, ModulesOptions,
                                   SelectiveOptions, SyncOptions)

__all__ = ["ActivationsOptions", "AutoOptions", "DiskOptions", "HiddenStatesOptions", "ManagerOptions",
           "ModulesOptions", "SelectiveOptions", "SyncOptions"]
