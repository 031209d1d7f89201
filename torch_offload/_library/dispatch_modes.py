"""Our own ops inside a user's function are ours, not the function's: a selective checkpointing
policy's dispatch modes must not see the saves and restores we make around its ops."""
import contextlib

import torch
from torch.utils._python_dispatch import _disable_current_modes

_NO_MODE = contextlib.nullcontext()


def outside_dispatch_modes():
    """Context in which our own save and restore ops are not seen by the dispatch modes on the stack
    (a selective checkpointing policy's): _disable_current_modes() where there are any, nothing to
    enter and leave otherwise (the usual case, once per save or restore)."""
    return _disable_current_modes() if torch._C._len_torch_dispatch_stack() else _NO_MODE
