"""mode="hidden_states": each block runs under torch_offload.checkpoint: its input (the hidden states)
goes to pinned host memory during forward and comes back, prefetched, when backward recomputes the
block. Every block input is offloaded whatever its size."""
from torch import nn

from ..blocks import ForwardWrapper
from ..checkpointing.checkpoint import checkpoint
from .installer import CheckpointInstaller


class CheckpointedForward(ForwardWrapper):
    """A block's forward under torch_offload.checkpoint while training with grad enabled."""

    def __init__(self, block: nn.Module, manager, use_reentrant: bool = False):
        super().__init__(block)
        self.manager, self.use_reentrant = manager, use_reentrant

    def __call__(self, *args, **kwargs):
        if self.training_with_grad():
            return checkpoint(self.run, *args, manager=self.manager, use_reentrant=self.use_reentrant, **kwargs)
        return self.run(*args, **kwargs)


class HiddenStates(CheckpointInstaller):
    def wrappers(self, blocks, manager, options, chose_depth):
        return [CheckpointedForward(block, manager, options.use_reentrant) for block in blocks]
