"""What apply() takes: an OffloadConfig (offload_config.py) built from a frozen dataclass per
activation mode (mode_options.py: the manager's fields, each mode's options, and the table of modes
by name) and the parts beside it (parts.py: layer offloading, chunked loss, tiling, long context).
aliases.py holds the names trainer configs use, defaults.py the package's own defaults; keywords.py
builds a config from an entry point's keywords."""
from .errors import OptionError
from .mode_options import (ActivationsOptions, AutoOptions, DiskOptions, HiddenStatesOptions, ManagerOptions,
                           ModulesOptions, SelectiveOptions, SyncOptions)
from .offload_config import OffloadConfig
from .parts import ChunkedLossOptions, LayerOffloadingOptions, LongContextOptions, TilingOptions

__all__ = ["ActivationsOptions", "AutoOptions", "ChunkedLossOptions", "DiskOptions", "HiddenStatesOptions",
           "LayerOffloadingOptions", "LongContextOptions", "ManagerOptions", "ModulesOptions", "OffloadConfig",
           "OptionError", "SelectiveOptions", "SyncOptions", "TilingOptions"]
