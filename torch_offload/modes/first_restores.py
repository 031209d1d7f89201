"""Backward's first restores, prefetched while the LM head's backward runs.

Backward restores the newest saves first (the last block's input, and under a selective policy its
attention outputs), and no restore before them starts their copies: the compute stream would wait
for each copy at the start of backward. When the model has an
output embedding (a Hugging Face causal LM's lm_head), a hook on its output starts those copies as
soon as backward reaches it: after the loss's backward, whose buffers make the step's peak, and
before the LM head's two matrix products, which the copies then overlap. Models without one, or a
loss that never calls the LM head's forward (chunked_loss), start them at their first restore.
"""
import torch
from torch import nn


class _StartCopies:
    """Tensor hook on the LM head's output: its gradient is ready, the LM head's backward is next.
    Copies as many saves as the manager's prefetch depth is now (selective raises it after the first
    forward, modes/selective.py)."""

    def __init__(self, manager, device: torch.device):
        self.manager, self.device = manager, device

    def __call__(self, grad: torch.Tensor) -> None:
        count = max(1, self.manager.prefetch_depth())
        self.manager.prefetch_newest(self.device, count)  # returns None: the gradient is unchanged


class PrefetchFirstRestores:
    """Forward hook of the output embedding: hooks each output that backward will reach. Data, not a
    closure, so that a deep copy of the model hooks the copy's manager (copy_and_pickle.py)."""

    def __init__(self, manager):
        self.manager = manager

    def __call__(self, module: nn.Module, args, output) -> None:
        if isinstance(output, torch.Tensor) and output.requires_grad and output.device.type != "cpu":
            output.register_hook(_StartCopies(self.manager, output.device))


def prefetch_first_restores(handle) -> None:
    """Installs the hook for `handle`'s model and manager (apply(): modes hidden_states, selective
    and modules); handle.remove() removes it. Prefetches as many saves as the manager's prefetch
    depth at that backward (the saves of one block, or of one selected module call)."""
    get_head = getattr(handle.model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, nn.Module):
        return
    handle.on_remove(head.register_forward_hook(PrefetchFirstRestores(handle.manager)))
