"""The named projection-group policies ("attention+qkv+out_proj", "attention+qkv+keep_fc1", ...) in
compiled graphs (torch_offload.compile(mode="selective")).

Eager selective finds a projection's product by its call: torch.nn.functional.linear with that
module's weight (policies/interception.py). A compiled graph is traced into aten ops, where a Linear is
a matrix product whose second operand is the weight transposed, a traced value with no module
attached. The policy here recognises a projection by that operand's shape instead: the products of
matrix products whose weight has the shape of a group's Linear are offloaded (or kept, for
"keep_<group>"), the fused attention outputs as under "attention", everything else recomputed. A
Linear of the blocks outside the groups with one of those shapes would be taken for a projection,
so such a policy is refused with the shapes named (pass a policy function instead), as is an
offloaded and a kept group whose weights share a shape.
"""
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

from ..policies.projections import projection_groups, projection_weights, saves_per_block, split_kept
from ..policies.named_policies import ATTENTION_OPS, SAVES_PER_BLOCK

_MM = torch.ops.aten.mm.default
_ADDMM = torch.ops.aten.addmm.default


def projection_policy(policy: str, blocks, caller: str):
    """(torch policy function, saves per block) for a named policy with projection groups."""
    offloaded, kept = split_kept(projection_groups(policy))
    shapes = {}  # weight shape -> the decision for products of that weight
    group_weights = set()
    for decision, groups in ((CheckpointPolicy.MUST_CPU_OFFLOAD, offloaded), (CheckpointPolicy.MUST_SAVE, kept)):
        for block in blocks:
            for weight in projection_weights(block, groups):  # raises for a group a block lacks
                if shapes.setdefault(tuple(weight.shape), decision) != decision:
                    raise ValueError(f"{caller}: policy={policy!r}: in compiled graphs a projection is recognised "
                                     f"by its weight's shape, and an offloaded and a kept group share the shape "
                                     f"{tuple(weight.shape)}; offload or keep both")
                group_weights.add(id(weight))
    clashes = sorted({f"{name} {tuple(m.weight.shape)}" for block in blocks for name, m in block.named_modules()
                      if isinstance(m, nn.Linear) and id(m.weight) not in group_weights
                      and tuple(m.weight.shape) in shapes})
    if clashes:
        raise ValueError(f"{caller}: policy={policy!r}: in compiled graphs a projection is recognised by its "
                         f"weight's shape, and Linear modules outside the policy's groups have those shapes "
                         f"({', '.join(clashes)}); add their group to the policy or pass a policy function")

    def decide(ctx, op, *args, **kwargs):
        if op in ATTENTION_OPS:
            return CheckpointPolicy.MUST_CPU_OFFLOAD
        if op is _MM or op is _ADDMM:
            shape = tuple((args[1] if op is _MM else args[2]).shape)
            # Weights have static sizes; a symbolic one (an activation's, under dynamic=True) is
            # never read as an int, which would specialise the graph on it.
            if len(shape) == 2 and all(type(n) is int for n in shape):
                return shapes.get((shape[1], shape[0]), CheckpointPolicy.PREFER_RECOMPUTE)
        return CheckpointPolicy.PREFER_RECOMPUTE

    return decide, max((saves_per_block(policy, block) for block in blocks), default=SAVES_PER_BLOCK)
