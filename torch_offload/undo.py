"""UndoStack: the changes something made to a model, each pushed with what undoes it; remove() runs
the undos, the last first. Every handle of the package is one (OffloadHandle, the parts' handles,
torch_offload.compile's offload_changes), so a change is undone the same way wherever it was made.

An undo is data (a bound method or a functools.partial of objects the model reaches), never a
closure: copy.deepcopy((model, handle)) gives the copy's handle, whose undos act on the copy."""
import functools
from typing import Callable, List

from torch import nn

from .copy_and_pickle import NotPicklable

class _Absent:
    """An attribute the object did not have of its own. One object, also in a deep copy (an undo
    of a copied model compares against it)."""

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return "ABSENT"


ABSENT = _Absent()


def put_back(obj, name: str, previous) -> None:
    """The attribute as it was: `previous`, or, where it was absent, deleted."""
    if previous is not ABSENT:
        setattr(obj, name, previous)
    elif name in getattr(obj, "__dict__", {}):
        delattr(obj, name)


def set_forward(module: nn.Module, forward) -> None:
    """Installs `forward` (a wrapper) as the module's, or with None goes back to its class's."""
    if forward is None:
        module.__dict__.pop("forward", None)
    else:
        module.forward = forward


class UndoStack(NotPicklable):
    """Changes and their undos. Subclasses push what they change; remove() is theirs to extend,
    never to write again."""

    _pickled_what = "its handle"

    def __init__(self):
        self._undo: List[Callable[[], None]] = []

    def push(self, undo: Callable[[], None]) -> None:
        """remove() calls `undo` (after the undos pushed later)."""
        self._undo.append(undo)

    def on_remove(self, *hook_handles) -> None:
        """remove() also removes these hooks (torch.utils.hooks.RemovableHandle)."""
        for hook in hook_handles:
            self.push(hook.remove)

    def set_attribute(self, obj, name: str, value) -> None:
        """setattr(obj, name, value); remove() puts back the value it had (or its absence)."""
        previous = obj.__dict__.get(name, ABSENT) if isinstance(obj, nn.Module) else getattr(obj, name, ABSENT)
        self.push(functools.partial(put_back, obj, name, previous))
        setattr(obj, name, value)

    def replace_forward(self, module: nn.Module, forward) -> None:
        """module.forward = forward; remove() puts back the module's own forward (or its class's)."""
        self.push(functools.partial(set_forward, module, module.__dict__.get("forward")))
        set_forward(module, forward)

    def remove(self) -> None:
        """Undoes every change, the last made first. An undo that fails does not stop the others;
        the first failure is raised after all have run. A second call does nothing."""
        failure = None
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception as error:  # noqa: BLE001  (the rest still have to be undone)
                failure = failure or error
        if failure is not None:
            raise failure
