"""FSDP2 (fully_shard) on 2 CPU processes over gloo: every torch_offload mode, applied before or
after fully_shard, trains with losses and gradients bit-equal (fp32) to plain FSDP2 (with torch's
gradient checkpointing for hidden_states); also with reshard_after_forward=False, nested FSDP
units, FSDP2's CPUOffloadPolicy, and a bf16 MixedPrecisionPolicy (within bf16 tolerance).
All cases run in one launch of the two ranks (python_tests/fsdp2_cases.py), which takes ~45 s."""
import pytest
import torch.distributed as dist

import fsdp2_cases
from gloo_ranks import run_ranks

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch built without distributed")

CASES = [f"{mode}-{order}{variant}" for mode in fsdp2_cases.MODES for order in fsdp2_cases.ORDERS
         for variant in ("", "-no_reshard", "-nested")]
CASES += [f"{mode}-after{variant}" for mode in fsdp2_cases.MODES for variant in ("-bf16", "-cpu_offload")]


@pytest.fixture(scope="module")
def results():
    return run_ranks(fsdp2_cases.run_all, 2, CASES, timeout_s=300)


@pytest.mark.parametrize("case", CASES)
def test_mode_under_fsdp2_matches_plain_fsdp2(results, case):
    assert results[case] == "ok", results[case]
