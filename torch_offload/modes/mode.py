"""What a mode gives apply(): its name, its options (a frozen dataclass), the manager they build, and
what it installs on the model. apply() does the shared work once (reads the options, finds the
blocks, builds the manager and the handle) and then calls install()."""
from typing import List, Optional

from torch import nn

from .._engine.manager import OffloadManager
from ..blocks import BlockForward
from ..handle import OffloadHandle
from .first_restores import prefetch_first_restores
from .options import MANAGER_FIELDS


class Mode:
    """One value of apply(mode=...). Subclasses set `name` and `options_type` and define install()."""

    name: str = ""
    options_type: type = None
    # Whether apply() finds and checks the blocks (the decoder layers by default) for this mode.
    wraps_blocks = True
    # Why a keyword a user may expect is not one of this mode's options.
    hints: dict = {}

    def manager_kwargs(self, options, blocks) -> Optional[dict]:
        """OffloadManager's keyword arguments for `options`, or None for a mode without a manager."""
        return options.manager_kwargs()

    def manager_keywords(self) -> tuple:
        """The options that build the manager: not taken together with a ready manager=."""
        return MANAGER_FIELDS

    def build_manager(self, options, blocks):
        kwargs = self.manager_kwargs(options, blocks)
        return OffloadManager(**kwargs) if kwargs is not None else None

    def new_handle(self, model: nn.Module, manager, blocks, options) -> OffloadHandle:
        return OffloadHandle(model, self.name, manager)

    def install(self, handle: OffloadHandle, blocks: Optional[List[nn.Module]], options) -> None:
        raise NotImplementedError


class CheckpointMode(Mode):
    """A mode that checkpoints each block with a wrapper of its own (hidden_states, selective); mode
    "auto" composes these wrappers (wrappers() and finish()) for its trials."""

    def wrappers(self, blocks: List[nn.Module], manager, options) -> List[BlockForward]:
        """One forward wrapper per block."""
        raise NotImplementedError

    def finish(self, handle: OffloadHandle) -> None:
        """What the model needs once its blocks are wrapped: a Hugging Face model's own gradient
        checkpointing off (ours replaces it: twice would recompute twice) and its KV cache off (a
        recomputed layer cannot fill it); backward's first restores started during the LM head's
        backward."""
        handle.disable_hf_checkpointing()
        handle.disable_kv_cache()
        if handle.manager is not None:
            prefetch_first_restores(handle)

    def install(self, handle: OffloadHandle, blocks: List[nn.Module], options) -> None:
        for wrapper in self.wrappers(blocks, handle.manager, options):
            handle.wrap(wrapper)
        self.finish(handle)
