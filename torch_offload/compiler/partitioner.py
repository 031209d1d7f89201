"""The partition-time pass that puts our ops into torch.compile graphs (torch_offload.compile).

Mechanism: Inductor's `custom_partitioner_fn` option (a documented inductor
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
views and non-contiguous outputs; docs/concepts/engine.md). At partition time every saved tensor is a plain graph
value, so nothing is skipped, and stream/event logic stays inside the C++ kernels.

Which saved tensors move:
  "hidden_states": those the backward feeds into recomputed (activation-checkpointed) regions,
                   i.e. the checkpoint inputs; the model runs under torch's own checkpointing.
  "selective":     those, plus the outputs a selective-checkpointing policy marked
                   CheckpointPolicy.MUST_CPU_OFFLOAD (e.g. attention outputs and their logsumexp):
                   saved instead of recomputed, and offloaded. Torch's partitioner does not act on
                   that tag, so the pass turns it into MUST_SAVE before partitioning.
  "all":           every saved activation (not a graph input such as a parameter) of at least
                   min_bytes.
"""
import hashlib
from pathlib import Path
from typing import Any, Optional

import torch
import torch._prims_common
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.custom_graph_pass import CustomPartitionerFn
from torch.utils.checkpoint import CheckpointPolicy

from .._engine import ops  # noqa: F401  (the ops' fake kernels, which tracing the rewritten graphs needs)
from .._engine.layouts import dense_permutation, inverse_permutation

COMPILE_MODES = ("hidden_states", "selective", "all")
_SAVE = torch.ops.offload.offload_save.default
_RESTORE = torch.ops.offload.offload_restore.default
_OFFLOAD_TAG = "torch_offload_offload"  # node meta: a policy asked for this value to be offloaded
_KEEP_TAG = "torch_offload_keep"  # node meta: a policy asked for this value to stay on the device


def _output_node(graph: torch.fx.Graph) -> torch.fx.Node:
    return next(n for n in reversed(graph.nodes) if n.op == "output")


def _fake_like(val: torch.Tensor, device) -> torch.Tensor:
    with val.fake_mode:
        return torch.empty(val.shape, dtype=val.dtype, device=device)


def _dense_order(val: torch.Tensor):
    """The dimension order in which `val` is contiguous (identity when it is), or None when its
    strides overlap or leave gaps (a transpose or an SDPA output is dense; an expand is not)."""
    if val.is_contiguous():
        return list(range(val.dim()))
    # Decided without guards first: under dynamic shapes the strides are symbols.
    if not torch._prims_common.is_non_overlapping_and_dense_or_false(val):
        return None
    return dense_permutation(val)


def _permuted(graph: torch.fx.Graph, node: torch.fx.Node, order, val) -> torch.fx.Node:
    """node.permute(order) as a graph node (node itself for the identity); `val` is its value."""
    if list(order) == list(range(len(order))):
        return node
    permuted = graph.call_function(torch.ops.aten.permute.default, (node, list(order)))
    permuted.meta["val"] = val
    return permuted


def _feeds_recompute(placeholder: torch.fx.Node) -> bool:
    return any(user.meta.get("recompute") is not None for user in placeholder.users)


def _save_what_policies_offload(joint: torch.fx.GraphModule) -> None:
    """MUST_CPU_OFFLOAD -> MUST_SAVE plus our tag: the partitioner saves the value, we offload it.
    MUST_SAVE gets the keep tag: such a value feeds the recompute in backward, like a checkpoint
    input, but the policy wants it on the device. The forward graph's nodes keep the joint nodes'
    meta, so the tags reach _selected."""
    for node in joint.graph.nodes:
        if node.meta.get("recompute") == CheckpointPolicy.MUST_CPU_OFFLOAD:
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            node.meta[_OFFLOAD_TAG] = True
        elif node.meta.get("recompute") == CheckpointPolicy.MUST_SAVE:
            node.meta[_KEEP_TAG] = True


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
        _save_what_policies_offload(gm)
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
        if self.mode == "all":
            return True
        if _feeds_recompute(placeholder) and not saved.meta.get(_KEEP_TAG, False):
            return True
        return self.mode == "selective" and saved.meta.get(_OFFLOAD_TAG, False)

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
            order = _dense_order(val)
            if order is None:
                continue  # overlapping or gapped strides: a dense copy could not be viewed back
            dense = val.permute(order)  # contiguous: what the handle holds
            # Right after the saved value: an extern kernel's input is materialised where it runs,
            # so inductor cannot defer the boundary (and keep what it is computed from alive) to
            # one fused kernel at the end of the forward.
            with fwd.graph.inserting_after(saved):
                source = _permuted(fwd.graph, saved, order, dense)
            with fwd.graph.inserting_after(source):
                handle = fwd.graph.call_function(_SAVE, (source, manager_id))
            handle.meta["val"] = _fake_like(dense, "cpu")
            outputs[index] = handle

            first_use = min(placeholder.users, key=bwd_order.__getitem__)
            with bwd.graph.inserting_before(first_use):
                restored = bwd.graph.call_function(_RESTORE, (placeholder, val.device, manager_id))
                restored.meta["val"] = _fake_like(dense, val.device)
                # The inverse permutation gives the value back its original strides.
                restored = _permuted(bwd.graph, restored, inverse_permutation(order), val)
            placeholder.replace_all_uses_with(restored, delete_user_cb=lambda user: user is not restored
                                              and user not in restored.all_input_nodes)
            placeholder.meta["val"] = _fake_like(dense, "cpu")
            offloaded.append(saved.name)
        fwd_out.args = (tuple(outputs),)
        fwd.recompile()
        bwd.recompile()
        return offloaded
