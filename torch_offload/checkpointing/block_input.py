"""A checkpointed block's first tensor input (its hidden states) in host memory: saved when the block
runs, restored for its recompute. Shared by both checkpoint variants (checkpoint.py, reentrant.py).
A DTensor input (sequence or context parallel hidden states) is offloaded as its local shard and
rebuilt as the same DTensor, without communication (_library/dtensors.py)."""
import re

import torch

from .._library import node_budget
from .._library.dispatch_modes import outside_dispatch_modes
from .._library.dtensors import join_local, split_local


# The engine's version check on offload_restore (csrc/version_check.h), which names the raw ops: a
# checkpoint's restore reports it in terms of what the user did instead.
_MODIFIED = re.compile(r"modified in place after it was saved \(its version went from (\d+) to (\d+)\)")


class OffloadedInput:
    """The host handle of one block input, and what restores it as it was."""

    __slots__ = ("handle", "device", "dtensor_spec", "requires_grad", "manager_id")

    def __init__(self, x: torch.Tensor, manager_id: int):
        local, self.dtensor_spec = split_local(x.detach())
        try:
            self.handle = torch.ops.offload.offload_save(local, manager_id)
        except RuntimeError as error:
            node_budget.name_in_error(error, manager_id)
            raise
        self.device, self.requires_grad, self.manager_id = local.device, x.requires_grad, manager_id

    def restore(self) -> torch.Tensor:
        """The input again, on its device, a leaf that requires grad as the original did. Outside
        any dispatch mode of the recompute (a selective checkpointing policy's): the restore is ours,
        not an op of the user's function."""
        with outside_dispatch_modes():
            try:
                restored = torch.ops.offload.offload_restore(self.handle, self.device, self.manager_id)
            except RuntimeError as error:
                modified = _MODIFIED.search(str(error))
                if modified is None:
                    raise
                raise RuntimeError(self._modified(*modified.groups())) from None
            return join_local(restored, self.dtensor_spec).requires_grad_(self.requires_grad)

    def _modified(self, saved_version: str, version: str) -> str:
        # As autograd's own message for a saved tensor changed in place (versions, the tensor's type).
        shape = list(self.handle.shape)
        return (f"torch_offload.checkpoint: a checkpointed block's input (a tensor saved for backward, "
                f"{self.handle.dtype} {shape} on {self.device}, from which backward recomputes the "
                f"block) was modified in place after it was saved: it is at version {version}; expected "
                f"version {saved_version} instead. Backward would recompute the block from the changed "
                "values: modify a clone of it, or change it before the checkpointed call.")
