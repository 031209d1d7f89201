"""mode="auto", per block: the last blocks may keep their MLP's up/gate products on the device.

Under a selective policy the recompute of a block is mostly its MLP's up and gate projections
(attention and the projections named in the policy come back from host memory). Their products are
too large for the link to carry in the time that recompute takes, but the memory budget often has
room until the last blocks' backward (the early peak, unchecked_tail.py): blocks that keep those products
("<policy>+keep_fc1", policies/projections.py) skip that recompute at about a third of the memory an
unchecked block keeps; on the Llama-3-8B shape that beat auto's unchecked tail at checkpointing's
peak (docs/performance.md, "auto").

next_kept_trial() plans those trials from auto's rows: the first from the fastest fitting row without
a tail, as many blocks as the early phase's room takes at an estimate of 8 block inputs per block
(Llama keeps 5.5-7: two products of 2.75-3.5x the hidden size); the next by the bytes per block
measured (stats()["policy_kept_bytes"], policies/store.py) and the room or the excess measured, as the unchecked tail does.
"""
import math
from typing import List, Optional

from ...policies.projections import projection_groups, projection_weights, split_kept
from .unchecked_tail import TAIL_MARGIN, block_input_gb
from .trials import Trial, TrialResult

KEPT_GROUP = "keep_fc1"
KEPT_TRIES = 3  # trials with kept products, at most
BLOCK_INPUTS_PER_BLOCK = 8  # the first trial's estimate of one block's kept products


def kept_policy(candidate: str) -> Optional[str]:
    """The candidate's policy keeping its MLP's up/gate products, or None where it has no named
    policy or already moves or keeps them."""
    kind, _, policy = candidate.partition(":")
    groups = projection_groups(policy) if kind == "selective" else None  # aliases written out
    if groups is None or "fc1" in sum(split_kept(groups), ()):
        return None
    return "+".join(("attention",) + groups + (KEPT_GROUP,))


def can_keep_mlp(blocks, candidate: str) -> bool:
    """Whether every block has the up/gate projections the candidate's kept policy names."""
    policy = kept_policy(candidate)
    if policy is None:
        return False
    try:
        for block in blocks:
            projection_weights(block, projection_groups(policy))
    except ValueError:
        return False
    return True


def block_policies(candidate: str, n_blocks: int, kept_blocks: int) -> List[str]:
    """One policy per block: the candidate's, the last `kept_blocks` keeping their products."""
    policy = candidate.partition(":")[2]
    return [policy] * (n_blocks - kept_blocks) + [kept_policy(candidate)] * kept_blocks


def next_kept_trial(results: List[TrialResult], budget_gb: float, n_blocks: int, eligible) -> Optional[Trial]:
    """Auto's next trial with kept products, or None. `eligible(candidate)`: whether its blocks have
    up/gate projections to keep."""
    kept = [r for r in results if r.kept_mlp_blocks]
    if len(kept) >= KEPT_TRIES:
        return None
    if not kept:
        rows = [r for r in results if r.peak_allocated_gb <= budget_gb and not r.tail_blocks
                and kept_policy(r.candidate) and eligible(r.candidate) and r.early_peak_gb is not None]
        if not rows:
            return None
        base = min(rows, key=lambda r: r.step_s)
        per_block = BLOCK_INPUTS_PER_BLOCK * block_input_gb(results, n_blocks)
        if per_block <= 0:
            return None
        blocks = min(n_blocks, math.floor((budget_gb - base.early_peak_gb) * (1 - TAIL_MARGIN) / per_block))
        return Trial(base.candidate, base.keep_on_device_bytes, 0, blocks) if blocks > 0 else None
    last = kept[-1]
    base = min((r for r in results if r.candidate == last.candidate and not r.tail_blocks and not r.kept_mlp_blocks),
               key=lambda r: r.step_s)
    within = last.peak_allocated_gb <= budget_gb
    if within and last.step_s >= base.step_s:
        return None  # keeping does not pay here
    per_block = last.kept_gb / last.kept_mlp_blocks
    if per_block <= 0:
        return None
    if not within:
        blocks = last.kept_mlp_blocks - math.ceil((last.peak_allocated_gb - budget_gb) * (1 + TAIL_MARGIN) / per_block)
    elif last.early_peak_gb is not None:
        blocks = last.kept_mlp_blocks + math.floor((budget_gb - last.early_peak_gb) * (1 - TAIL_MARGIN) / per_block)
    else:
        return None
    blocks = max(0, min(blocks, n_blocks))
    if blocks == 0 or blocks in {r.kept_mlp_blocks for r in kept}:
        return None
    return Trial(last.candidate, last.keep_on_device_bytes, 0, blocks)
