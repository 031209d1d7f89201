"""What apply() takes: an OffloadConfig (offload_config.py) built from a frozen dataclass per
activation mode (mode_options.py, which also holds the table of modes by name; the manager's fields
in manager_options.py) and the parts beside it (parts.py: layer offloading, chunked loss, tiling, long
context). aliases.py holds the names trainer configs use, defaults.py every default; keywords.py
builds a config from an entry point's keywords."""
from .errors import OptionError
from .manager_options import ManagerOptions
from .mode_options import (ActivationsOptions, AutoOptions, DiskOptions, HiddenStatesOptions, ModulesOptions,
                           SelectiveOptions, SyncOptions)
from .offload_config import OffloadConfig
from .parts import ChunkedLossOptions, LayerOffloadingOptions, LongContextOptions, TilingOptions

__all__ = ["ActivationsOptions", "AutoOptions", "ChunkedLossOptions", "DiskOptions", "HiddenStatesOptions",
           "LayerOffloadingOptions", "LongContextOptions", "ManagerOptions", "ModulesOptions", "OffloadConfig",
           "OptionError", "SelectiveOptions", "SyncOptions", "TilingOptions"]
