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

Which saved tensors move (as in the eager modes of the same names):
  "hidden_states": those the backward feeds into recomputed (activation-checkpointed) regions,
                   i.e. the checkpoint inputs, whatever their size; the model runs under torch's
                   own checkpointing. No min_bytes.
  "selective":     those, plus the outputs of at least min_bytes (default 64 KiB, as eager
                   selective's) that a selective-checkpointing policy marked
                   CheckpointPolicy.MUST_CPU_OFFLOAD (e.g. attention outputs and their logsumexp):
                   saved instead of recomputed, and offloaded. Torch's partitioner does not act on
                   that tag, so the pass turns it into MUST_SAVE before partitioning.
  "all":           every saved activation (not a graph input such as a parameter) of at least
                   min_bytes (default 1 MiB, as eager "all").
Each graph also records what it kept and why (OffloadPartitioner.kept): a compiled model none of
whose graphs offloads anything says why with a NothingOffloadedWarning (compile_model.py).
"""
import hashlib
from pathlib import Path
from typing import Any, Optional

import torch
import torch._prims_common
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.custom_graph_pass import CustomPartitionerFn
from torch.utils.checkpoint import CheckpointPolicy

from .._library import ops  # noqa: F401  (the ops' fake kernels, which tracing the rewritten graphs needs)
from .._library import layouts as _layouts
from .._library.layouts import dense_permutation, inverse_permutation
from ..config.mode_options import ActivationsOptions, HiddenStatesOptions, SelectiveOptions
from ..config.mode_options import canonical_mode

# The modes the pass serves, by their options class: its defaults are eager's (min_bytes where none
# is given; "hidden_states" takes none).
COMPILED_OPTIONS = {options.mode_name: options for options in (HiddenStatesOptions, SelectiveOptions,
                                                                ActivationsOptions)}
COMPILE_MODES = tuple(COMPILED_OPTIONS)
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


def check_min_bytes(mode: str, min_bytes, call: str) -> int:
    """The min_bytes `mode` uses: the mode's default for None; for "hidden_states" (every checkpoint
    input whatever its size, as eager) a min_bytes is the same error as eager's."""
    try:
        name = canonical_mode(mode)
    except ValueError:
        name = None
    if name not in COMPILE_MODES:
        raise ValueError(f"{call}: unknown mode {mode!r}; expected one of {COMPILE_MODES}")
    mode = name
    if mode == "hidden_states":
        if min_bytes is not None:
            raise TypeError(f"{call}(mode='hidden_states') got an unexpected keyword argument 'min_bytes' "
                            "(mode='hidden_states' offloads every checkpoint input whatever its size; "
                            "min_bytes is for modes 'selective' and 'all')")
        return 0
    if min_bytes is None:
        return COMPILED_OPTIONS[mode].min_bytes
    if type(min_bytes) is not int or min_bytes < 0:
        raise (TypeError if type(min_bytes) is not int else ValueError)(
            f"{call}(mode={mode!r}): min_bytes={min_bytes!r}; expected an int >= 0")
    return min_bytes


class OffloadPartitioner(CustomPartitionerFn):
    """min-cut partition, then offload the selected saved tensors through the manager.
    min_bytes: None for the mode's default (its options class's); not taken by "hidden_states"."""

    def __init__(self, manager, mode: str = "hidden_states", min_bytes: Optional[int] = None,
                 call: str = "torch_offload.OffloadPartitioner"):
        self.min_bytes = check_min_bytes(mode, min_bytes, call)
        self.manager = manager
        self.mode = canonical_mode(mode)
        self.offloaded = []  # per compiled graph: names of the saved tensors it offloads
        self.kept = []  # per compiled graph: {why: how many} of the saved tensors it leaves (_Kept)
        self.graphs = []  # per compiled graph: the rewritten (forward, backward) GraphModules

    def uuid(self) -> Optional[Any]:
        # Inductor's cache key: whatever shapes the rewritten graphs, i.e. the sources of the rewrite
        # (this module and the layouts it permutes saved values by), the mode and min_bytes, and the
        # manager id, which is baked into the graphs.
        source = hashlib.sha256(b"".join(Path(path).read_bytes() for path in (__file__, _layouts.__file__)))
        return (source.hexdigest(), self.mode, self.min_bytes, self.manager.id())

    def __call__(self, gm, joint_inputs, **kwargs):
        _save_what_policies_offload(gm)
        fwd, bwd = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        kept = _Kept()
        self.offloaded.append(self._rewrite(fwd, bwd, kwargs["num_fwd_outputs"], kept))
        self.kept.append(kept)
        self.graphs.append((fwd, bwd))
        return fwd, bwd

    def _selected(self, saved: torch.fx.Node, placeholder: torch.fx.Node, kept: "_Kept") -> bool:
        val = saved.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return False  # a symbolic size (dynamic shapes), not a tensor
        if saved.op == "placeholder":
            return kept.add("graph_input")  # graph inputs (parameters, user inputs) are not ours to move
        if val.layout != torch.strided or val.device.type not in ("cuda", "cpu"):
            return kept.add("not_dense")
        # min_bytes applies to what "all" saves and to a policy's outputs, as in eager "all" and
        # "selective"; a checkpoint input moves whatever its size, as eager's block input does.
        if self.mode == "all" or (self.mode == "selective" and saved.meta.get(_OFFLOAD_TAG, False)):
            size = val.numel() * val.element_size()
            return size >= self.min_bytes or kept.add("under_min_bytes", size)
        if _feeds_recompute(placeholder) and not saved.meta.get(_KEEP_TAG, False):
            return True
        return kept.add("kept_by_policy" if saved.meta.get(_KEEP_TAG, False) else "not_checkpoint_input")

    def nothing_offloaded(self) -> Optional[str]:
        """Why no graph partitioned so far offloads anything (a NothingOffloadedWarning's text), or
        None when one does, or none was partitioned (inductor's cache) or none saved a tensor."""
        if not self.graphs or any(self.offloaded):
            return None
        kept = _Kept()
        for graph in self.kept:
            kept.merge(graph)
        if not kept.counts:
            return None  # nothing saved for backward: nothing to offload
        return f"torch_offload.compile(mode={self.mode!r}): the compiled graphs offload nothing: " + kept.why(self)

    def _rewrite(self, fwd: torch.fx.GraphModule, bwd: torch.fx.GraphModule, num_fwd_outputs: int,
                 kept: "_Kept"):
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
            if not placeholder.users or not self._selected(saved, placeholder, kept):
                continue
            val = saved.meta["val"]
            order = _dense_order(val)
            if order is None:
                kept.add("not_dense")
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


class _Kept:
    """What one graph leaves on the device among the tensors its forward saves for backward, by
    reason, for the warning when nothing at all is offloaded."""

    def __init__(self):
        self.counts = {}
        self.largest_under = 0

    def add(self, why: str, size: int = 0) -> bool:
        """Counts one tensor left on the device; False (not selected), for `return kept.add(...)`."""
        self.counts[why] = self.counts.get(why, 0) + 1
        if why == "under_min_bytes" and type(size) is int:  # not a symbolic size: reading it would guard
            self.largest_under = max(self.largest_under, size)
        return False

    def merge(self, other: "_Kept") -> None:
        for why, count in other.counts.items():
            self.counts[why] = self.counts.get(why, 0) + count
        self.largest_under = max(self.largest_under, other.largest_under)

    def why(self, partitioner: OffloadPartitioner) -> str:
        def saved(why: str, singular: str, plural: str) -> str:
            count = self.counts[why]
            return f"{count} saved tensor{'' if count == 1 else 's'} {singular if count == 1 else plural}"

        parts = []
        if "under_min_bytes" in self.counts:
            parts.append(saved("under_min_bytes", "was", "were") + f" under min_bytes={partitioner.min_bytes} (the "
                         f"largest: {self.largest_under} bytes); pass a smaller min_bytes (e.g. min_bytes=0) to "
                         "offload them")
        if "not_checkpoint_input" in self.counts:
            parts.append("no saved tensor is a checkpoint input (" + saved("not_checkpoint_input", "feeds", "feed")
                         + " no recomputed region): the blocks did not run under gradient checkpointing in these "
                         "graphs (compile() turns on a Hugging Face model's own, or checkpoints blocks=[...])")
        if "kept_by_policy" in self.counts:
            parts.append(saved("kept_by_policy", "was", "were") + " marked MUST_SAVE by the policy (kept)")
        if "not_dense" in self.counts:
            parts.append(saved("not_dense", "is not dense and stays", "are not dense and stay")
                         + " (sparse, overlapping or gapped strides)")
        if "graph_input" in self.counts:
            parts.append(saved("graph_input", "is a graph input", "are graph inputs")
                         + " (parameters, the model's inputs), kept on the device")
        return "; ".join(parts)
