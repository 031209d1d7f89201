"""The candidates mode="auto" measures, each trial resolved to the options of the checkpointing mode
it names (hidden_states, selective with a named policy) and installed on a handle of its own through
that mode's installer, with the trial's window, unchecked tail and kept products; or torch's own
checkpoint ("checkpointing", nothing offloaded)."""
import functools
from typing import Callable, List

from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from ...blocks import ForwardWrapper
from ...config.mode_options import AUTO_CANDIDATES, AutoOptions, HiddenStatesOptions, SelectiveOptions
from ...handle import OffloadHandle
from ..installer import finish_checkpointing
from ...policies.projections import projection_groups, projection_weights
from .kept_products import block_policies
from .trials import Trial


def default_candidates(blocks, use_reentrant: bool) -> List[str]:
    """AUTO_CANDIDATES without the selective policies whose projections a block lacks. The reentrant
    variant reruns the whole block, its MLP's down projection included (torch's non-reentrant
    checkpoint stops before it): there a policy with projection groups offloads "fc2" too."""
    kept = []
    for candidate in AUTO_CANDIDATES:
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


def trial_options(trial: Trial, n_blocks: int, options: AutoOptions):
    """The options of the mode the trial runs on its `n_blocks` checkpointed blocks (None: torch's
    checkpoint)."""
    if trial.candidate == "checkpointing":
        return None
    shared = dict(max_in_flight=options.max_in_flight, host_budget_bytes=options.host_budget_bytes,
                  keep_on_device_bytes=trial.keep_on_device_bytes, use_reentrant=options.use_reentrant)
    if trial.candidate == "hidden_states":
        return HiddenStatesOptions(**shared)
    return SelectiveOptions(block_policies=block_policies(trial.candidate, n_blocks, trial.kept_mlp_blocks), **shared)


class TorchCheckpointForward(ForwardWrapper):
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


def install_trial(installer_for: Callable, model: nn.Module, blocks: List[nn.Module], options: AutoOptions,
                  trial: Trial) -> OffloadHandle:
    """The trial installed on a handle of its own: its candidate on every block but the last
    `trial.tail_blocks` (those run as they are: unchecked). `installer_for(mode options)`: the mode
    that installs them."""
    blocks = blocks[:len(blocks) - trial.tail_blocks]
    mode_options = trial_options(trial, len(blocks), options)
    handle = OffloadHandle(model)
    try:
        if mode_options is None:
            for block in blocks:
                handle.wrap(TorchCheckpointForward(block, options.use_reentrant))
            finish_checkpointing(handle)
        else:
            installer_for(mode_options).install(handle, blocks, mode_options)
    except BaseException:
        handle.remove()
        raise
    return handle
