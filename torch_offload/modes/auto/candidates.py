"""The candidates mode="auto" measures, and how one is installed for a trial: the wrappers of the
checkpointing modes it names (hidden_states, selective with a named policy), composed on the blocks
with the trial's window, unchecked tail and kept products, or torch's own checkpoint.

"checkpointing" (torch's checkpoint, nothing offloaded) is a candidate because where the step is
bound by the host (short sequences) it can be the fastest, and auto should never lose to it.
"""
import functools
from typing import List

from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from ...blocks import BlockForward
from ...handle import OffloadHandle
from ...policies.projections import is_fast_policy, projection_groups, projection_weights
from .kept import block_policies

CANDIDATES = ("hidden_states", "selective:attention", "selective:attention+qkv+out_proj", "checkpointing")


def is_candidate(candidate) -> bool:
    if candidate in CANDIDATES:
        return True
    kind, _, policy = str(candidate).partition(":")
    try:
        return kind == "selective" and is_fast_policy(policy)
    except ValueError:
        return False


def default_candidates(blocks, use_reentrant: bool) -> List[str]:
    """CANDIDATES without the selective policies whose projections a block lacks. The reentrant
    variant reruns the whole block, its MLP's down projection included (torch's non-reentrant
    checkpoint stops before it): there a policy with projection groups offloads "fc2" too."""
    kept = []
    for candidate in CANDIDATES:
        groups = projection_groups(candidate.partition(":")[2]) if candidate.startswith("selective:") else ()
        if groups and use_reentrant:
            candidate, groups = candidate + "+fc2", groups + ("fc2",)
        try:
            for block in blocks if groups else ():
                projection_weights(block, groups)
        except ValueError:
            continue
        kept.append(candidate)
    return kept


class TorchCheckpointForward(BlockForward):
    """The "checkpointing" candidate: torch's checkpoint, nothing offloaded."""

    def __init__(self, block: nn.Module, use_reentrant: bool):
        super().__init__(block)
        self.use_reentrant = use_reentrant

    def __call__(self, *args, **kwargs):
        if not self.training_with_grad():
            return self.run(*args, **kwargs)
        if self.use_reentrant:  # torch's reentrant checkpoint takes no keyword arguments
            return torch_checkpoint(functools.partial(self.run, **kwargs), *args, use_reentrant=True)
        return torch_checkpoint(self.run, *args, use_reentrant=False, **kwargs)


def install_candidate(modes, model, blocks, options, candidate: str, keep_on_device_bytes: int = 0, tail: int = 0,
                      kept_blocks: int = 0) -> OffloadHandle:
    """The candidate on every block but the last `tail` (those run as they are: unchecked); the last
    `kept_blocks` of those keep their MLP's up/gate products (kept.py). `modes`: the modes auto
    composes (.hidden_states, .selective); `options`: auto's (AutoOptions)."""
    blocks = blocks[:len(blocks) - tail]
    if candidate == "checkpointing":
        handle = OffloadHandle(model, "checkpointing", None)
        for block in blocks:
            handle.wrap(TorchCheckpointForward(block, options.use_reentrant))
        handle.disable_hf_checkpointing()
        handle.disable_kv_cache()
        return handle
    shared = dict(max_in_flight=options.max_in_flight, host_budget_bytes=options.host_budget_bytes,
                  keep_on_device_bytes=keep_on_device_bytes, use_reentrant=options.use_reentrant)
    if candidate == "hidden_states":
        mode, mode_options = modes.hidden_states, modes.hidden_states.options_type(**shared)
    else:
        mode = modes.selective
        mode_options = mode.options_type(block_policies=block_policies(candidate, len(blocks), kept_blocks), **shared)
    manager = mode.build_manager(mode_options, blocks)
    handle = OffloadHandle(model, mode.name, manager)
    for wrapper in mode.wrappers(blocks, manager, mode_options):
        handle.wrap(wrapper)
    mode.finish(handle)
    return handle
