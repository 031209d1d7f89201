"""What mode "auto" tries and what it measured: a Trial names a candidate and how its last blocks and
window are set; a TrialResult holds the measurements of one; Phase says which round of trials the
controller is in (controller.py)."""
import dataclasses
import enum
from typing import List, Optional

GB = 1e9


class Phase(enum.Enum):
    """The rounds of trials, in order: each candidate as it is; the fastest with a window of the
    newest saves kept on the GPU; a window that went over the budget, shrunk; the last blocks not
    checkpointed at all (unchecked_tail.py); the last blocks keeping their MLP's up/gate products (kept_products.py);
    then the choice."""

    CANDIDATES = "candidates"
    WINDOWS = "windows"
    SMALLER_WINDOWS = "smaller windows"
    TAILS = "unchecked tails"
    KEPT_PRODUCTS = "kept up/gate products"
    DECIDED = "decided"


@dataclasses.dataclass(frozen=True)
class Trial:
    """A candidate ("hidden_states", "selective:<policy>", "checkpointing") on every block but the
    last `tail_blocks` (those run unchecked), the last `kept_mlp_blocks` of the others keeping
    their up/gate products, and `keep_on_device_bytes` of the newest saves kept on the GPU."""

    candidate: str
    keep_on_device_bytes: int = 0
    tail_blocks: int = 0
    kept_mlp_blocks: int = 0

    @property
    def plain(self) -> bool:
        """The candidate as it is: no window, no tail, no kept products."""
        return not (self.keep_on_device_bytes or self.tail_blocks or self.kept_mlp_blocks)


@dataclasses.dataclass
class TrialResult:
    """One trial's timed steps. The peaks (GB of allocated memory) are read on CUDA only: None on
    CPU. early_peak_gb: until the last checkpointed block's backward ended (unchecked_tail.py);
    tail_block_gb: the largest unchecked block's footprint; predicted_peak_gb: a window's peak as
    predicted from the candidate's own; kept_gb: products kept by "keep_" groups per step."""

    trial: Trial
    step_s: float  # the fastest timed step
    steps_s: List[float]
    bytes_to_host: int
    kept_gb: float = 0.0
    peak_allocated_gb: Optional[float] = None
    early_peak_gb: Optional[float] = None
    tail_block_gb: Optional[float] = None
    predicted_peak_gb: Optional[float] = None
    within_budget: Optional[bool] = None
    chosen: bool = False

    @property
    def candidate(self) -> str:
        return self.trial.candidate

    @property
    def keep_on_device_bytes(self) -> int:
        return self.trial.keep_on_device_bytes

    @property
    def keep_on_device_gb(self) -> float:
        return self.trial.keep_on_device_bytes / GB

    @property
    def tail_blocks(self) -> int:
        return self.trial.tail_blocks

    @property
    def kept_mlp_blocks(self) -> int:
        return self.trial.kept_mlp_blocks

    def as_row(self) -> dict:
        """The result as a flat dict, as the benchmarks' JSON records hold it (GB keys spelt _GB; the
        peaks only where measured)."""
        row = dataclasses.asdict(self.trial)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("_gb") and field.name != "kept_gb" and value is None:
                continue
            if field.name != "trial":
                row[field.name[:-3] + "_GB" if field.name.endswith("_gb") else field.name] = value
        row["keep_on_device_GB"] = self.keep_on_device_gb
        return row

    @property
    def measured(self) -> bool:
        """Whether its peak was read (CUDA)."""
        return self.peak_allocated_gb is not None

    @property
    def early_or_peak_gb(self) -> float:
        """The peak until the last blocks' backward (what a window adds to), else the step's peak."""
        return self.early_peak_gb if self.early_peak_gb is not None else self.peak_allocated_gb


def plain_result(results: List[TrialResult], candidate: str) -> TrialResult:
    """The result of `candidate` measured as it is."""
    return next(r for r in results if r.candidate == candidate and r.trial.plain)
