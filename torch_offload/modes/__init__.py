"""The values of apply(mode=...), one module each: a mode's options (a frozen dataclass whose fields
are apply()'s keyword options in that mode) and what it installs on a model (mode.py: Mode).

hidden_states.py and selective.py checkpoint each block with a wrapper of their own; activations.py
("all", "sync", "disk") and modules.py install saved-tensor hooks; auto/ composes the wrappers of the
checkpointing modes and measures them. apply.py maps the names to the modes.
"""
from .auto import AutoOptions
from .modules import ModulesOptions
from .options import ActivationsOptions, HiddenStatesOptions, ManagerOptions
from .selective import SelectiveOptions

__all__ = ["ActivationsOptions", "AutoOptions", "HiddenStatesOptions", "ManagerOptions", "ModulesOptions",
           "SelectiveOptions"]
