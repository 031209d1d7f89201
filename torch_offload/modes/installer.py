"""What a mode does to a model: builds its manager from the mode's options and installs what wraps
each block, pushing each change's undo onto the handle (handle.py). The options themselves are data
(config/mode_options.py); install.py maps each options class to its installer (INSTALLERS)."""
from .._library.manager import OffloadManager
from .first_restores import prefetch_first_restores


class ModeInstaller:
    """The installer of one options class. Subclasses define install()."""

    # Whether apply() finds and checks the blocks (the decoder layers by default) for this mode.
    wraps_blocks = True

    def build_manager(self, options, blocks):
        return OffloadManager(**options.manager_kwargs())

    def install(self, handle, blocks, options, manager=None) -> None:
        """Installs the mode on handle.model's `blocks` (handle: the OffloadHandle whose undo stack
        takes each change), with `manager` (None: built from the options), setting handle.manager."""
        raise NotImplementedError


class CheckpointInstaller(ModeInstaller):
    """A mode that checkpoints each block with a wrapper of its own (hidden_states, selective); mode
    "auto" installs these for its trials."""

    def wrappers(self, blocks, manager, options, chose_depth: bool) -> list:
        """One forward wrapper (blocks.ForwardWrapper) per block; `chose_depth`: the manager's prefetch depth is the mode's
        choice (built here, prefetch_depth not given), which the wrappers may raise."""
        raise NotImplementedError

    def after_wrapping(self, handle, wrappers: list, options) -> None:
        """What the mode adds once its wrappers are installed (nothing by default)."""

    def install(self, handle, blocks, options, manager=None) -> None:
        handle.manager = manager if manager is not None else self.build_manager(options, blocks)
        chose_depth = manager is None and options.prefetch_depth is None
        wrappers = self.wrappers(blocks, handle.manager, options, chose_depth)
        for wrapper in wrappers:
            handle.wrap(wrapper)
        self.after_wrapping(handle, wrappers, options)
        finish_checkpointing(handle)


def finish_checkpointing(handle) -> None:
    """What a model needs once its blocks are checkpointed by us: a Hugging Face model's own gradient
    checkpointing off (ours replaces it: twice would recompute twice) and its KV cache off (a
    recomputed layer cannot fill it); backward's first restores started during the LM head's
    backward."""
    handle.disable_hf_checkpointing()
    handle.disable_kv_cache()
    if handle.manager is not None:
        prefetch_first_restores(handle)
