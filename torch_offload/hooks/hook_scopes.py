"""Saved-tensor hooks entered in a module's forward pre-hook and left in its forward hook.

Module hooks cannot use a `with` block, so the hooks entered for each call go on a stack, one per
thread (calls nest, and a checkpoint's recompute runs forwards on a backward thread); the forward
hook (registered with always_call=True, so it also runs after an exception) leaves the top one.
"""
import threading
from typing import Optional

import torch


class HookScopes:
    def __init__(self):
        self._local = threading.local()

    def __deepcopy__(self, memo):
        return HookScopes()  # what is entered belongs to calls running now, not to a copy

    def enter(self, hooks: Optional[torch.autograd.graph.saved_tensors_hooks]) -> None:
        """Enters `hooks`, or with None only records that this call entered nothing."""
        if hooks is not None:
            hooks.__enter__()
        self._local.__dict__.setdefault("stack", []).append(hooks)

    def exit(self) -> None:
        stack = self._local.__dict__.get("stack")
        if stack:
            hooks = stack.pop()
            if hooks is not None:
                hooks.__exit__(None, None, None)
