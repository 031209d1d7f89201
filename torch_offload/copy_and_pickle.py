"""copy.deepcopy and pickling of a model that apply() / offload_layers() changed.

copy.deepcopy(model) (EMA and teacher copies) copies everything the model reaches, our wrappers
included. They are objects whose attributes are the block, the forward they wrap and the manager,
never closures, so the copy's wrappers come out bound to the copy's blocks: the copy computes with
its own weights. Each OffloadManager is copied as torch copies it (a fresh manager with the same
configuration, shared by everything in the copy that shared it); state tied to one process or one
call (locks, thread-local hook stacks, host copies of weights) is rebuilt instead of copied.

Pickling (torch.save(model)) is refused with an error saying what to do: a manager's host copies
and hooks cannot outlive the process, and a model loaded with our wrappers would be half-applied.
"""
import copy
from typing import Callable, Dict


class NotPicklable:
    """Mixin: pickling raises a TypeError naming `_pickled_what` and what to do instead; a deep
    copy copies the object's attributes through the memo (copy_attributes), and a subclass whose
    state is tied to a process or a call overrides __deepcopy__ to build that anew."""

    _pickled_what = "a torch_offload object"

    def __reduce_ex__(self, protocol):
        raise TypeError(
            f"torch_offload: cannot pickle a model with offloading applied, as torch.save(model) "
            f"does ({self._pickled_what} cannot be pickled): call handle.remove() first and apply "
            "again after loading, or save model.state_dict() instead; copy.deepcopy(model) works")

    def __deepcopy__(self, memo):
        # (deepcopy would otherwise fall back to __reduce_ex__, which refuses)
        return copy_attributes(self, memo)


def copy_attributes(obj, memo: dict, fresh: Dict[str, Callable[[], object]] = None):
    """A new instance of type(obj), registered in `memo` before its attributes are copied (they
    may lead back to it), whose attributes are deep copies of obj's through `memo`, except those
    named in `fresh`, which are built anew by their factory."""
    fresh = fresh or {}
    new = type(obj).__new__(type(obj))
    memo[id(obj)] = new
    for name, value in obj.__dict__.items():
        new.__dict__[name] = fresh[name]() if name in fresh else copy.deepcopy(value, memo)
    return new
