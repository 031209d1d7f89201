"""Offloading inside torch.compile graphs.

Mechanism: a partition-time pass. Inductor's `custom_partitioner_fn` option (a documented inductor
config) lets us wrap the default min-cut partitioner: after it has split the joint graph into the
forward and backward graphs, we rewrite the tensors the forward saves for the backward:

    forward:   saved = f(...)            ->  handle = offload.offload_save(saved, manager)
               return (..., saved)            return (..., handle)
    backward:  use(saved)                ->  saved = offload.offload_restore(handle, device, manager)
                                              use(saved)

so the compiled graphs call our ops and the pinned pool, in-flight bound and prefetch of the C++
engine apply. The restore is placed just before the first backward node that needs the tensor.

Why this and not the alternatives: saved-tensor hooks graph-break inside compiled regions;
torch's experimental `enable_activation_offloading` (joint_custom_pass + prims.device_put) crashed
with a separate stream and freed 0.14 of 1.61 GB boundary bytes on the reference model (it skips
views and non-contiguous outputs, DESIGN.md). At partition time every saved tensor is a plain graph
value, so nothing is skipped, and stream/event logic stays inside the C++ kernels.

Which saved tensors move:
  "hidden_states": those the backward feeds into recomputed (activation-checkpointed) regions,
                   i.e. the checkpoint inputs; the model runs under torch's own checkpointing.
  "all":           every saved activation (not a graph input such as a parameter) of at least
                   min_bytes.
"""
import hashlib
from pathlib import Path
from typing import Any, Optional

import torch
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from ._ops import offload_restore, offload_save  # noqa: F401  (registers the fakes)
from .manager import OffloadManager

COMPILE_MODES = ("hidden_states", "all")
_SAVE = torch.ops.offload.offload_save.default
_RESTORE = torch.ops.offload.offload_restore.default


def _output_node(graph: torch.fx.Graph) -> torch.fx.Node:
    return next(n for n in reversed(graph.nodes) if n.op == "output")


def _fake_like(val: torch.Tensor, device) -> torch.Tensor:
    with val.fake_mode:
        return torch.empty(val.shape, dtype=val.dtype, device=device)


def _feeds_recompute(placeholder: torch.fx.Node) -> bool:
    return any(user.meta.get("recompute") is not None for user in placeholder.users)


class OffloadPartitioner(CustomPartitionerFn):
    """min-cut partition, then offload the selected saved tensors through the manager."""

    def __init__(self, manager, mode: str = "hidden_states", min_bytes: int = 1 << 20):
        if mode not in COMPILE_MODES:
            raise ValueError(f"torch_offload.compile: unknown mode {mode!r}; expected one of {COMPILE_MODES}")
        self.manager = manager
        self.mode = mode
        self.min_bytes = min_bytes
        self.offloaded = []  # per compiled graph: names of the saved tensors it offloads
        self.graphs = []  # per compiled graph: the rewritten (forward, backward) GraphModules

    def uuid(self) -> Optional[Any]:
        # The manager id is baked into the compiled graphs, so it is part of the cache key.
        source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
        return (source, self.mode, self.min_bytes, self.manager.id())

    def __call__(self, gm, joint_inputs, **kwargs):
        fwd, bwd = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        self.offloaded.append(self._rewrite(fwd, bwd, kwargs["num_fwd_outputs"]))
        self.graphs.append((fwd, bwd))
        return fwd, bwd

    def _selected(self, saved: torch.fx.Node, placeholder: torch.fx.Node) -> bool:
        val = saved.meta.get("val")
        if saved.op == "placeholder" or not isinstance(val, torch.Tensor):
            return False  # graph inputs (parameters, user inputs) are not ours to move
        if val.layout != torch.strided or val.device.type not in ("cuda", "cpu"):
            return False
        if val.numel() * val.element_size() < self.min_bytes:
            return False
        return self.mode == "all" or _feeds_recompute(placeholder)

    def _rewrite(self, fwd: torch.fx.GraphModule, bwd: torch.fx.GraphModule, num_fwd_outputs: int):
        manager_id = self.manager.id()
        fwd_out = _output_node(fwd.graph)
        outputs = list(fwd_out.args[0])
        bwd_inputs = {n.name: n for n in bwd.graph.nodes if n.op == "placeholder"}
        bwd_order = {n: i for i, n in enumerate(bwd.graph.nodes)}  # before any insertion
        offloaded = []
        for index in range(num_fwd_outputs, len(outputs)):
            saved = outputs[index]
            if not isinstance(saved, torch.fx.Node) or saved.name not in bwd_inputs:
                continue
            placeholder = bwd_inputs[saved.name]
            if not self._selected(saved, placeholder) or not placeholder.users:
                continue
            val = saved.meta["val"]
            # Right after the saved value: an extern kernel's input is materialised where it runs,
            # so inductor cannot defer the boundary (and keep what it is computed from alive) to
            # one fused kernel at the end of the forward.
            with fwd.graph.inserting_after(saved):
                handle = fwd.graph.call_function(_SAVE, (saved, manager_id))
            handle.meta["val"] = _fake_like(val, "cpu")
            outputs[index] = handle

            first_use = min(placeholder.users, key=bwd_order.__getitem__)
            with bwd.graph.inserting_before(first_use):
                restored = bwd.graph.call_function(_RESTORE, (placeholder, val.device, manager_id))
            restored.meta["val"] = val
            placeholder.replace_all_uses_with(restored, delete_user_cb=lambda user: user is not restored)
            placeholder.meta["val"] = _fake_like(val, "cpu")
            offloaded.append(saved.name)
        fwd_out.args = (tuple(outputs),)
        fwd.recompile()
        bwd.recompile()
        return offloaded


def compile(model: torch.nn.Module, mode: str = "hidden_states", *, manager=None,
            min_bytes: int = 1 << 20, blocks=None, backend: str = "inductor",
            options: Optional[dict] = None, **compile_kwargs):
    """torch.compile(model) with offloading inside the compiled graphs.

    mode="hidden_states": the model's blocks run under torch's gradient checkpointing (a Hugging Face
    model's own, or torch.utils.checkpoint around `blocks`), and the checkpoint inputs are offloaded.
    mode="all": no checkpointing; every saved activation of at least min_bytes is offloaded.
    backend="inductor" (default) passes our partitioner through inductor's custom_partitioner_fn
    option, leaving every other inductor setting as it is; backend="aot_eager" runs the same
    partitioned graphs with eager kernels (numerically identical to eager, for checking).
    Returns the compiled module; `.offload_partitioner` records what each graph offloads (nothing
    when inductor loads the graphs from its cache: they still call our ops) and holds the manager
    (`.offload_partitioner.manager.stats()`). Other keyword arguments (fullgraph=True,
    dynamic=...) go to torch.compile.
    """
    # Compiled graphs launch far ahead of the GPU: with saves a layer apart (hidden_states), earlier
    # sources are released in stream order at each save, or the allocator would still count them
    # at the forward's peak. In "all" mode saves are a few kernels apart and that wait would stall.
    if manager is None:
        manager = OffloadManager(release_sources_on_save=mode == "hidden_states")
    partitioner = OffloadPartitioner(manager, mode, min_bytes)
    if mode == "hidden_states":
        _enable_checkpointing(model, blocks)
    if backend == "inductor":
        options = dict(options or {})
        options["custom_partitioner_fn"] = partitioner
        compiled = torch.compile(model, options=options, **compile_kwargs)
    elif backend == "aot_eager":
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func

        def run_eagerly(gm, _example_inputs):
            return make_boxed_func(gm.forward)

        eager_backend = aot_autograd(fw_compiler=run_eagerly, bw_compiler=run_eagerly,
                                     partition_fn=partitioner)
        compiled = torch.compile(model, backend=eager_backend, **compile_kwargs)
    else:
        raise ValueError(f"torch_offload.compile: backend must be 'inductor' or 'aot_eager', got {backend!r}")
    compiled.offload_partitioner = partitioner
    return compiled


def _enable_checkpointing(model: torch.nn.Module, blocks) -> None:
    if blocks is None and hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if getattr(model, "config", None) is not None:
            model.config.use_cache = False
        return
    if blocks is None:
        from .blocks import find_blocks

        blocks = find_blocks(model)
    for block in blocks:
        forward = type(block).forward.__get__(block)
        block.forward = _checkpointed(forward)


def _checkpointed(forward):
    def run(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
