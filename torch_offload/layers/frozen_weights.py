"""offload_layers(): the frozen weights of each layer live in host memory and visit the GPU only
while the layer runs.

Adapter training (LoRA) keeps a large frozen base model on the GPU although only the adapters
train. After offload_layers(model), every frozen parameter of each decoder layer is a CPU tensor
whose storage is a pinned host buffer of our engine (offload_save's handle), so state_dict() and
the optimizer see the same Parameter objects as before. While a layer's forward runs (including
a checkpoint's recompute in backward), a fresh device copy of each frozen weight is restored and
installed in its module; the next layer in execution order is prefetched on the side stream
(reverse order in backward); when the forward returns, the original host Parameters are put back
and the device copies are dropped, never copied back (they are frozen). The weights autograd saves
for backward are packed as tokens (hooks/weight_tokens.py) and fetched again, prefetched, in backward.
Trainable parameters (the adapters) and buffers stay where they are. With keep_layers_that_fit, the
layers whose weights fit in the room the steps leave keep their device copies (kept_layers.py).
"""
import copy
from typing import Iterable, List, Optional

import torch
from torch import nn

from .._library.ops import offload_restore, offload_save
from .._library.dtensors import is_dtensor as _is_dtensor
from ..blocks import ForwardWrapper, find_blocks
from ..undo import set_forward
from ..copy_and_pickle import copy_attributes
from ..undo import UndoStack
from ..hooks.nothing_offloaded import warn_nothing_offloaded
from ..hooks.hook_scopes import HookScopes
from .._library.manager import MANAGER_DEFAULTS, OffloadManager
from .._library import node_budget
from ..hooks import weight_tokens
from .kept_layers import KeptLayers

_WRAPPED = "_torch_offload_layer"  # attribute marking a block wrapped by offload_layers
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # an integer dtype per element size


def available_host_bytes() -> Optional[int]:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    return node_budget.host_memory_bytes("MemAvailable")


class _FrozenWeight:
    """One frozen parameter of a layer: where it is installed, its host handle and source."""

    def __init__(self, module: nn.Module, name: str, param: nn.Parameter, qualified: str, layer: "_Layer"):
        self.module, self.name, self.param, self.qualified = module, name, param, qualified
        self.device = param.device
        self.manager_id = layer.offloader.manager.id()
        self.handle = None  # the host copy (set by offload_layers; the parameter's data after it)
        self.version = None  # the parameter's version once its data is the host copy
        self.kept = None  # the device copy its layer keeps (keep_layers_that_fit), else None
        self.source = weight_tokens.WeightSource(param.dtype, self.device_copy, layer.on_backward_fetch)

    def restore(self) -> torch.Tensor:
        """A fresh device copy of the host copy."""
        return offload_restore(self.handle, self.device, self.manager_id)

    def device_copy(self) -> torch.Tensor:
        """The copy to compute with: the kept one, else a fresh one."""
        return self.kept if self.kept is not None else self.restore()

    def holds_its_values(self, device_copy: torch.Tensor) -> bool:
        """Whether `device_copy`, whose version moved during the forward, still holds this weight's
        values bit for bit. A version counts writes and also some calls that write nothing: PEFT's
        LoRA on a parameter (MoE experts, routers) registers a torch parametrization around each
        forward, which set_()s the parameter to itself. Compared with the host copy restored once
        more: only weights whose version moved pay this copy."""
        restored = self.restore()
        if device_copy.shape != restored.shape or device_copy.dtype != restored.dtype:
            return False
        same_size_int = _BITS.get(restored.element_size()) if restored.is_floating_point() else None
        if same_size_int is not None:  # bits, not values: NaN == NaN, -0.0 != 0.0
            return torch.equal(device_copy.view(same_size_int), restored.view(same_size_int))
        return torch.equal(device_copy, restored)

    def use_host_copy(self) -> None:
        """The host copy (saved and synchronized) becomes the parameter's data."""
        self.param.data = self.handle
        self.version = self.param._version

    def copy_for(self, layer: "_Layer", manager, memo: dict) -> "_FrozenWeight":
        """This weight in a deep copy of the model, saved to the copy's `manager`: copy.deepcopy
        gave the copy's Parameter a plain host tensor (a clone of our host copy), not a handle."""
        new = copy_attributes(self, memo, {"source": lambda: None, "handle": lambda: None, "kept": lambda: None})
        new.manager_id = manager.id()
        new.source = weight_tokens.WeightSource(new.param.dtype, new.device_copy, layer.on_backward_fetch)
        new.handle = offload_save(new.param.detach(), new.manager_id)
        return new

    def check(self) -> None:
        p = self.param
        if p._version != self.version:
            raise RuntimeError(
                f"torch_offload.offload_layers: the frozen weight {self.qualified} was modified in "
                "place after offload_layers; its host copy is the weight, so the change would reach "
                "only part of training. Call handle.remove() before changing frozen weights, then "
                "offload_layers again."
            )
        if self.module._parameters.get(self.name) is not p:
            raise RuntimeError(
                f"torch_offload.offload_layers: the frozen weight {self.qualified} was replaced in "
                "its module after offload_layers (by fully_shard, which installs its own sharded "
                "and unsharded parameters, or by assigning a new Parameter). Layer offloading and "
                "FSDP2 do not combine: apply offloading after fully_shard (long_context=True then "
                "leaves layer offloading off, the frozen base sharded), pass layer_offloading=False, "
                "or use fully_shard(..., offload_policy=CPUOffloadPolicy()) to keep sharded weights "
                "in host memory; call handle.remove() first."
            )
        if p.device.type != "cpu" or p.untyped_storage().data_ptr() != self.handle.untyped_storage().data_ptr():
            raise RuntimeError(
                f"torch_offload.offload_layers: the frozen weight {self.qualified} was moved or "
                "replaced after offload_layers (model.to()/cuda() or .data assignment). Call "
                "handle.remove() first, then offload_layers again."
            )


class _Layer:
    """A wrapped block: its frozen weights and the requires_grad flags they were wrapped with."""

    def __init__(self, block: nn.Module, index: int, name: str, offloader: "LayerOffloadHandle"):
        self.block, self.index, self.name, self.offloader = block, index, name, offloader
        self.prefetched_for_task = None  # graph task whose backward already prefetched from here
        self.previous_forward = block.__dict__.get("forward")
        self.flags = [(n, p.requires_grad) for n, p in block.named_parameters()]
        self.weights: List[_FrozenWeight] = []
        seen = set()
        for module_name, module in block.named_modules():
            for pname, p in module.named_parameters(recurse=False):
                if p.requires_grad or id(p) in seen:
                    continue
                seen.add(id(p))
                qualified = ".".join(part for part in (name, module_name, pname) if part)
                self.weights.append(_FrozenWeight(module, pname, p, qualified, self))
        self.frozen_bytes = sum(w.param.numel() * w.param.element_size() for w in self.weights)

    def __deepcopy__(self, memo):
        # The copy's weights go to the copy of our manager (fresh, same configuration).
        manager = copy.deepcopy(self.offloader.manager, memo)
        new = copy_attributes(self, memo, {"prefetched_for_task": lambda: None, "weights": list})
        try:
            new.weights = [w.copy_for(new, manager, memo) for w in self.weights]
            manager.synchronize()
        except RuntimeError as error:
            raise RuntimeError(
                f"torch_offload: copy.deepcopy of a model with offload_layers: the copy's frozen "
                f"weights of layer {self.name or self.index} go to a new manager with the same "
                f"configuration (host_budget_bytes={manager.host_budget_bytes()}), and saving them "
                f"failed: {error}") from error
        for w in new.weights:
            w.use_host_copy()
        return new

    def check(self) -> None:
        now = [(n, p.requires_grad) for n, p in self.block.named_parameters()]
        if now != self.flags:
            raise RuntimeError(
                f"torch_offload.offload_layers: the parameters of layer {self.name or self.index} "
                f"changed (requires_grad or the parameter set) after offload_layers: wrapped with "
                f"{self.flags}, now {now}. Call handle.remove() and offload_layers again after "
                "changing what trains."
            )
        for w in self.weights:
            w.check()

    def prefetch(self) -> None:
        for w in self.weights:
            if w.kept is None:
                self.offloader.manager.prefetch(w.handle, w.device)

    def keep(self) -> None:
        """From now on this layer's device copies stay (made now: see kept_layers.py)."""
        for w in self.weights:
            if w.kept is None:
                w.kept = w.restore()

    def drop_kept(self) -> None:
        for w in self.weights:
            w.kept = None

    def on_backward_fetch(self) -> None:
        # First weight of this layer fetched by a backward pass: prefetch the layer before it.
        task = torch._C._current_graph_task_id()
        if task != -1 and self.prefetched_for_task != task:
            self.prefetched_for_task = task
            self.offloader.prefetch_layer(self.index - 1)


class LayerOffloadHandle(UndoStack):
    """What offload_layers() returns: the manager (stats), the layers, and remove().
    copy.deepcopy of the model copies it: the copy's frozen weights go to a copy of the manager."""

    _pickled_what = "its frozen-weight offloading (offload_layers)"

    def __init__(self, model: nn.Module, manager, kept: Optional[KeptLayers] = None):
        super().__init__()
        self.model = model
        self.manager = manager
        self.layers: List[_Layer] = []
        self.kept = kept  # which layers keep their device copies (None: none ever do)
        self._scopes = HookScopes()  # the weight hooks entered per model call

    def stats(self) -> dict:
        return dict(self.manager.stats())

    @property
    def kept_layers(self) -> List[int]:
        """The indices of the layers whose device copies stay on the GPU now (keep_layers_that_fit)."""
        return [layer.index for layer in self.layers if layer.weights and layer.weights[0].kept is not None]

    def _at_step_start(self, args, kwargs) -> None:
        x = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        # The room is measured on the device of the first frozen weight, whichever layer holds it:
        # a first layer that trains whole still starts the step.
        weight = next((w for layer in self.layers for w in layer.weights), None)
        if x is not None and weight is not None:
            self.kept.at_step_start(self.layers, x.numel(), weight.device)

    @property
    def offloaded_bytes(self) -> int:
        return sum(layer.frozen_bytes for layer in self.layers)

    def prefetch_layer(self, index: int) -> None:
        if 0 <= index < len(self.layers):
            self.layers[index].prefetch()

    def _put_weights_back(self) -> None:
        """Moves the frozen weights back to their devices, exactly as they were (restored through
        the engine, whatever tier holds them), and unwraps the layers."""
        self.manager.synchronize()
        for layer in self.layers:
            set_forward(layer.block, layer.previous_forward)
            layer.block.__dict__.pop(_WRAPPED, None)
            for w in layer.weights:
                w.param.data = w.restore()
                w.handle = None
                w.kept = None
        self.layers = []

    # Outermost saved-tensor hooks for the whole model call: weights saved anywhere that no inner
    # hooks of ours or torch's checkpoint handle become tokens.
    def _enter_model(self, module, args):
        self._scopes.enter(weight_tokens.weight_hooks() if torch.is_grad_enabled() else None)

    def _exit_model(self, module, args, output):
        self._scopes.exit()


class _WeightsOnDevice(ForwardWrapper):
    """A layer's forward: device copies of its frozen weights are installed while it runs."""

    def __init__(self, layer: _Layer):
        super().__init__(layer.block)
        self.layer = layer

    def __call__(self, *args, **kwargs):
        layer = self.layer
        layer.check()
        offloader = layer.offloader
        in_backward = torch._C._current_graph_task_id() != -1
        if layer.index == 0 and offloader.kept is not None and not in_backward:
            offloader._at_step_start(args, kwargs)
        installed = []  # (device copy, its version when installed, its registry key)
        # Backward starts with the last layer again: its forward prefetches it. The next forward
        # starts with the first layer: its recompute, the last of backward, prefetches it, so that
        # no step starts by waiting for the first layer's weights.
        prefetch_self = False
        try:
            for w in layer.weights:
                device_copy = nn.Parameter(w.device_copy(), requires_grad=False)
                key = weight_tokens.install(device_copy, w.source)
                installed.append((device_copy, device_copy._version, key))
                w.module._parameters[w.name] = device_copy
            if in_backward:  # a recompute: going down
                offloader.prefetch_layer(layer.index - 1)
                prefetch_self = layer.index == 0
            else:
                offloader.prefetch_layer(layer.index + 1)
                prefetch_self = layer.index == len(offloader.layers) - 1 and torch.is_grad_enabled()
            if prefetch_self:
                layer.prefetch()
            output = self.run(*args, **kwargs)
        finally:
            for w, (_, _, key) in zip(layer.weights, installed):
                weight_tokens.uninstall(key)
                w.module._parameters[w.name] = w.param
        moved = [(w, device_copy) for w, (device_copy, version, _) in zip(layer.weights, installed)
                 if device_copy._version != version]
        for w, device_copy in moved:
            if not w.holds_its_values(device_copy):
                raise RuntimeError(
                    f"torch_offload.offload_layers: the frozen weight {w.qualified} was modified in "
                    "place during the forward; the change would be lost (frozen weights are never "
                    "copied back). Call handle.remove() before changing frozen weights."
                )
        if moved and prefetch_self:
            layer.prefetch()  # the comparison's restores took the prefetched copies
        return output


def _refuse_sharded_parameters(blocks) -> None:
    """FSDP2 (fully_shard) and tensor parallelism make parameters DTensors, and FSDP2 swaps each
    module's parameters for unsharded ones around every forward: layer offloading, which installs
    device copies of whole weights in the same place, cannot work underneath."""
    for block in blocks:
        for name, p in block.named_parameters():
            if _is_dtensor(p):
                raise ValueError(
                    f"torch_offload.offload_layers: parameter {name} of layer {type(block).__name__} "
                    "is a DTensor (FSDP2 fully_shard or tensor parallel). Layer offloading does not "
                    "support sharded parameters; with FSDP2 use fully_shard(..., "
                    "offload_policy=CPUOffloadPolicy()) to keep the sharded weights in host memory "
                    "(activation offloading modes do work with FSDP2)."
                )


def _warn_no_frozen_weights(blocks) -> None:
    """Layer offloading of blocks whose parameters all train moves nothing: say so, once, at the
    call, rather than let the handle report 0 bytes."""
    kinds = ", ".join(sorted({type(block).__name__ for block in blocks}))
    trainable = len({id(p) for block in blocks for p in block.parameters()})
    found = f"all {trainable} of their parameters require grad" if trainable else "they have no parameters"
    warn_nothing_offloaded(
        f"torch_offload.offload_layers: nothing to offload: no frozen parameter in the {len(blocks)} "
        f"blocks ({kinds}): {found}. Layer offloading moves frozen weights (requires_grad=False), "
        "e.g. the base model under LoRA adapters, to host memory; freeze the base or turn layer "
        "offloading off (apply(..., layer_offloading=False), or no offload_layers call).")


def offload_layers(
    model: nn.Module,
    layers: Optional[Iterable[nn.Module]] = None,
    *,
    manager=None,
    host_budget_bytes: int = 0,
    node_host_budget_bytes: int = 0,
    max_in_flight: int = MANAGER_DEFAULTS.max_in_flight,
    keep_layers_that_fit: bool = False,
) -> LayerOffloadHandle:
    """Keeps the frozen parameters of each layer in (pinned) host memory; see the module docstring.

    `layers` defaults to the decoder layers of a Hugging Face model (PEFT models included); they
    should be listed in execution order (that is the prefetch order). Call it before apply(); or
    use apply(model, mode, layer_offloading=True), which does so. Raises when the frozen weights do
    not fit in available host memory or in `host_budget_bytes` (or this rank's share of
    `node_host_budget_bytes`, see node_budget.py), leaving the model unchanged. Blocks without any
    frozen parameter leave nothing to offload: a NothingOffloadedWarning says so.
    `keep_layers_that_fit`: from the second step at each input size, the layers whose weights fit in
    the GPU memory the first step left keep their device copies (kept_layers.py); on a CUDA device only.
    Returns a LayerOffloadHandle (stats(), offloaded_bytes, kept_layers, remove()).
    """
    blocks = list(layers) if layers is not None else find_blocks(model)
    if not blocks:
        raise ValueError("torch_offload.offload_layers: layers is empty")
    for block in blocks:
        if _WRAPPED in block.__dict__:
            raise ValueError("torch_offload.offload_layers: a layer is already offloaded; call remove() first")
        if "_torch_offload_handle" in block.__dict__:
            raise ValueError(
                "torch_offload.offload_layers: the layers are already wrapped by apply(); call "
                "offload_layers first (its weights must be on the device inside checkpointing and "
                "activation hooks), or use apply(..., layer_offloading=True)"
            )
    _refuse_sharded_parameters(blocks)
    names = {id(m): n for n, m in model.named_modules()}
    if manager is None:
        # prefetch_depth=0: the layer order, not the save order, says which weights come next.
        manager = OffloadManager(max_in_flight=max_in_flight, prefetch_depth=0,
                                 host_budget_bytes=host_budget_bytes,
                                 node_host_budget_bytes=node_host_budget_bytes)
    handle = LayerOffloadHandle(model, manager, KeptLayers() if keep_layers_that_fit else None)
    handle.layers = [_Layer(b, i, names.get(id(b), ""), handle) for i, b in enumerate(blocks)]
    weights = [w for layer in handle.layers for w in layer.weights]
    if not weights:
        _warn_no_frozen_weights(blocks)
    owners = {}
    for layer in handle.layers:
        for w in layer.weights:
            if owners.setdefault(id(w.param), layer.index) != layer.index:
                raise ValueError(f"torch_offload.offload_layers: {w.qualified} is shared between layers")
            if w.param.device.type == "meta":
                raise ValueError(f"torch_offload.offload_layers: {w.qualified} is on the meta device")
    needed = handle.offloaded_bytes
    available = available_host_bytes()
    if available is not None and needed > available:
        raise RuntimeError(
            f"torch_offload.offload_layers: the frozen layer weights need {needed / 2**30:.2f} GiB of "
            f"host memory, but only {available / 2**30:.2f} GiB is available (MemAvailable). Offload "
            "fewer layers (layers=[...]) or free host memory."
        )
    manager_id = manager.id()
    try:
        for w in weights:
            w.handle = offload_save(w.param.detach(), manager_id)
        manager.synchronize()
    except Exception as error:
        for w in weights:
            w.handle = None  # the host copies are freed; the parameters were not touched
        if isinstance(error, RuntimeError):
            node_budget.name_in_error(error, manager_id)
        raise
    for layer in handle.layers:
        for w in layer.weights:
            w.use_host_copy()
        set_forward(layer.block, _WeightsOnDevice(layer))
        layer.block.__dict__[_WRAPPED] = handle
    handle.push(handle._put_weights_back)
    handle.on_remove(model.register_forward_pre_hook(handle._enter_model),
                     model.register_forward_hook(handle._exit_model, always_call=True))
    return handle
