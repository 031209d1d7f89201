"""mode="auto": the first training steps try the checkpointing modes on this machine and this model
and keep the fastest whose peak memory fits a budget (planner.py); candidates.py installs each trial
from the wrappers of modes "hidden_states" and "selective"; tail.py and kept.py plan the trials that
spend the memory left under the budget per block."""
import dataclasses
import functools
from typing import Optional

from ..._engine.manager import MANAGER_DEFAULTS
from ..mode import Mode
from ..options import OptionError, check_bool, check_int
from .candidates import CANDIDATES, default_candidates, install_candidate, is_candidate
from .planner import AutoHandle


@dataclasses.dataclass(frozen=True)
class AutoOptions:
    """Options of mode="auto".

    memory_budget_gb: the peak allocated memory a candidate may reach (default: torch
        checkpointing's, measured in its trial).
    trial_steps: training steps per candidate (the first warms up, the others are timed).
    candidates: what to try, from "hidden_states", "selective:attention",
        "selective:attention+qkv+out_proj", "checkpointing" or "selective:<named policy>" (default:
        those whose projections the blocks have).
    max_in_flight, host_budget_bytes: of each candidate's manager (see ManagerOptions).
    use_reentrant: every candidate in its reentrant variant (ours and torch's).
    """

    memory_budget_gb: Optional[float] = None
    trial_steps: int = 3
    candidates: Optional[list] = None
    max_in_flight: int = MANAGER_DEFAULTS.max_in_flight
    host_budget_bytes: int = 0
    use_reentrant: bool = False

    def __post_init__(self):
        check_bool("use_reentrant", self.use_reentrant)
        check_int("max_in_flight", self.max_in_flight)
        check_int("host_budget_bytes", self.host_budget_bytes)
        if not isinstance(self.trial_steps, int) or self.trial_steps < 1:
            raise OptionError(f"trial_steps={self.trial_steps!r}; expected an int >= 1")
        if self.memory_budget_gb is not None and not self.memory_budget_gb > 0:
            raise OptionError(f"memory_budget_gb={self.memory_budget_gb!r}; expected a number > 0")
        if self.candidates is not None:
            candidates = list(self.candidates)
            if not candidates or not all(is_candidate(c) for c in candidates):
                raise OptionError(f"candidates={candidates!r}; choose from {CANDIDATES} (or 'selective:' with "
                                  "another named policy, e.g. 'selective:attention+fc2')")


class Auto(Mode):
    name = "auto"
    options_type = AutoOptions
    hints = {"prefetch_depth": "mode='auto' sets each candidate's prefetch depth",
             "policy": "mode='auto' tries the selective policies itself (candidates=)",
             "keep_on_device_bytes": "mode='auto' sizes it from the memory left under memory_budget_gb"}

    def __init__(self, hidden_states, selective):
        # The modes whose wrappers the candidates compose.
        self.hidden_states, self.selective = hidden_states, selective

    def manager_keywords(self) -> tuple:
        return ("max_in_flight", "host_budget_bytes")

    def manager_kwargs(self, options, blocks):
        return None  # one manager per candidate, built by each trial

    def new_handle(self, model, manager, blocks, options: AutoOptions) -> AutoHandle:
        if manager is not None:
            raise OptionError("manager= is not taken (auto builds one manager per candidate); pass "
                              "max_in_flight= / host_budget_bytes= instead")
        if options.candidates is None:
            options = dataclasses.replace(options, candidates=default_candidates(blocks, options.use_reentrant))
        return AutoHandle(model, blocks, options, functools.partial(install_candidate, self, model, blocks, options))

    def install(self, handle, blocks, options) -> None:
        pass  # AutoHandle installs each trial's candidate itself
