"""offload_modules(): offload only the activations saved inside chosen submodules.

Megatron's selective offload: pick the submodules whose saved activations are large and whose
compute hides the copy (core attention, qkv, fc1) and leave everything else resident. While a
selected module runs in training with grad enabled, the "all"-mode saved-tensor hooks
(offload_activations) are active; elsewhere nothing changes. The handle's report() says what the
last forward offloaded (expected_bytes: the distinct storages handed to the engine) and how much
of it the GPU actually got back (freed_bytes: those storages no longer alive once the copies have
finished). The two differ when something else still holds a saved tensor's storage, typically a
module output that is also saved by the next op.

Modules are chosen by targets and presets (selection.py, presets.py). Inside a module
a preset leaves out (the projections inside self_attn for "core_attn"), the hooks that were active
outside the selected module are back, as if it had not been selected.
"""
import threading
from typing import Iterable

import torch
from torch import nn

from ..hooks import weight_tokens
from ..hooks.offload_hooks import offload_activations, resident_tensors
from ..copy_and_pickle import copy_attributes
from ..undo import UndoStack
from ..hooks.nothing_offloaded import watch_model_steps
from ..hooks.hook_scopes import HookScopes
from .._library.manager import stats as manager_stats
from ..config.defaults import ACTIVATIONS_MIN_BYTES, MODULES_PREFETCH_DEPTH
from .selection import ModuleSelection, Target, plan_modules

_OFF = object()  # a selected module running in eval or without grad: nothing offloaded inside


class ModuleOffloadHandle(UndoStack):
    """What offload_modules() returns: selected modules (and the modules inside them left out),
    manager, report(), stats(), remove(). Its bound methods are the modules' hooks: a deep copy of
    the model copies it (copy_and_pickle.py)."""

    _pickled_what = "the module hooks of mode='modules' (offload_modules)"

    def __init__(self, model: nn.Module, selection: ModuleSelection, hooks_options: dict):
        super().__init__()
        self.model = model
        self.modules = selection.selected
        self.excluded = selection.excluded
        # batch_copies: each selected call's copies are issued together when it returns.
        self.hooks = offload_activations("all", keep=resident_tensors(model), record_offloaded=True,
                                         warn_on_exit=False, batch_copies=True, **hooks_options)
        self.manager = self.hooks.manager
        self._scopes = HookScopes()
        self._outside = threading.local()  # per thread: the hooks active outside each selected call

    def __deepcopy__(self, memo):
        return copy_attributes(self, memo, {"_outside": threading.local})

    def stats(self) -> dict:
        """The manager's statistics merged with the hooks' counters (see torch_offload.stats)."""
        return manager_stats(self.manager)

    def report(self) -> dict:
        """For the last forward: bytes offloaded (distinct storages) and bytes of those the device
        no longer holds. Call between forward and backward (backward frees everything anyway)."""
        self.manager.synchronize()  # copies done: the engine no longer holds any source
        return self.hooks.filter.report()

    def _new_forward(self, module, args):
        if torch.is_grad_enabled():
            self.hooks.filter.reset_record()

    def _enter(self, module, args):
        on = module.training and torch.is_grad_enabled()
        self._outside.__dict__.setdefault("stack", []).append(weight_tokens.top_hooks() if on else _OFF)
        self._scopes.enter(self.hooks if on else None)

    def _exit(self, module, args, output):
        self._scopes.exit()
        stack = self._outside.__dict__.get("stack")
        if stack:
            stack.pop()

    def _enter_excluded(self, module, args):
        # Saves go to the hooks active outside the innermost selected call, as if it were not
        # selected; weights of offloaded layers still become tokens (layer_offloading=True).
        stack = self._outside.__dict__.get("stack")
        outside = stack[-1] if stack else _OFF
        self._scopes.enter(None if outside is _OFF else weight_tokens.weight_hooks(outside))

    def _exit_excluded(self, module, args, output):
        self._scopes.exit()




def offload_modules(model: nn.Module, targets: Iterable[Target] = (), *, presets: Iterable[str] = (),
                    min_bytes: int = ACTIVATIONS_MIN_BYTES, manager=None, prefetch_depth: int = MODULES_PREFETCH_DEPTH,
                    **manager_options) -> ModuleOffloadHandle:
    """Offloads the activations saved inside the submodules `targets` and `presets` select (see
    select_modules, presets.PRESETS) in "all" mode: asynchronous, bounded copies, prefetched
    in backward (`prefetch_depth` copies ahead). Parameters, buffers and tensors under `min_bytes`
    stay. Options as for offload_activations (max_in_flight, host_budget_bytes) or a ready
    `manager` (which brings its own prefetch depth)."""
    handle = ModuleOffloadHandle(model, plan_modules(model, targets, presets),
                                 dict(manager=manager, min_bytes=min_bytes, prefetch_depth=prefetch_depth,
                                      **manager_options))
    handle.on_remove(model.register_forward_pre_hook(handle._new_forward), *watch_model_steps(model, handle.hooks))
    for _, module in handle.modules:
        handle.on_remove(module.register_forward_pre_hook(handle._enter),
                         module.register_forward_hook(handle._exit, always_call=True))
    for _, module in handle.excluded:
        handle.on_remove(module.register_forward_pre_hook(handle._enter_excluded),
                         module.register_forward_hook(handle._exit_excluded, always_call=True))
    return handle
