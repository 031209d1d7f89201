"""Named policies for selective offload (torch_offload.selective): which op outputs a checkpointed
block offloads, keeps, or recomputes. A policy has torch's signature,
`policy(ctx: SelectiveCheckpointContext, op: OpOverload, *args, **kwargs) -> CheckpointPolicy`.
"""
import torch
from torch.utils.checkpoint import CheckpointPolicy

aten = torch.ops.aten

# The fused attention kernels: their outputs (the attention output, its logsumexp, the RNG state of
# dropout) are what backward needs and what a recompute spends most on. The math SDPA
# (aten._scaled_dot_product_attention_math, chosen e.g. for dropout on CPU) decomposes into matmuls
# and softmax before any dispatch mode sees it, so under this policy it is simply recomputed.
ATTENTION_OPS = frozenset({
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_fused_attention_overrideable.default,
})


def attention(ctx, op, *args, **kwargs):
    """Offload the fused attention outputs through the engine; recompute everything else."""
    return CheckpointPolicy.MUST_CPU_OFFLOAD if op in ATTENTION_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def attention_save(ctx, op, *args, **kwargs):
    """Keep the fused attention outputs on the device (torch's selective checkpointing; the
    reference that "attention" is measured and tested against)."""
    return CheckpointPolicy.MUST_SAVE if op in ATTENTION_OPS else CheckpointPolicy.PREFER_RECOMPUTE


POLICIES = {"attention": attention, "attention_save": attention_save}

# A block under the "attention" policy saves three tensors (its input, the attention output, the
# logsumexp): the prefetch depth that keeps backward from waiting on each copy (eager and compiled).
SAVES_PER_BLOCK = 3


def resolve(policy, caller: str = None):
    """A policy function from a name in POLICIES, a list of ops (kept, as in torch's
    create_selective_checkpoint_contexts) or a policy function. Errors start with `caller: ` where
    given."""
    caller = f"{caller}: " if caller else ""
    if isinstance(policy, str):
        if policy not in POLICIES and (policy == "attention_qkv" or policy.startswith("attention+")):
            raise ValueError(f"{caller}policy={policy!r} (projection groups) needs the blocks' modules "
                             "(apply(mode='selective'), selective_checkpoint(block=), torch_offload.compile); "
                             "here use 'attention' or a policy function")
        if policy not in POLICIES:
            raise ValueError(f"{caller}unknown policy={policy!r}; expected one of {sorted(POLICIES)} "
                             "(eager selective also 'attention+qkv' and other projection groups), "
                             "a list of ops or a policy function")
        return POLICIES[policy]
    if isinstance(policy, (list, tuple, set, frozenset)):
        ops = frozenset(policy)
        for op in ops:
            if not isinstance(op, torch._ops.OpOverload):
                raise ValueError(f"{caller}policy lists ops as OpOverloads (torch.ops.aten.mm.default), "
                                 f"got {op!r}")
        return lambda ctx, op, *a, **k: (CheckpointPolicy.MUST_SAVE if op in ops
                                         else CheckpointPolicy.PREFER_RECOMPUTE)
    if callable(policy):
        return policy
    raise TypeError(f"{caller}policy must be a name, a list of ops or a function, got {type(policy).__name__}")
