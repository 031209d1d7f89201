"""Sequence-parallel hidden states (a DTensor sharded on the sequence dim at every block boundary) on
2 CPU processes over gloo (python_tests/support/tp_cases.py): hidden_states mode and torch_offload.checkpoint
offload the local shard and rebuild the same DTensor in the recompute, all mode offloads DTensor
activations; fp32 losses and gradients (parameters and the input) bit-equal to torch's checkpoint /
plain training, and the bytes offloaded are those of the local shards."""
import pytest
import torch.distributed as dist

from python_tests.support import tp_cases
from python_tests.support.gloo_ranks import run_ranks

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch built without distributed")


@pytest.fixture(scope="module")
def results():
    return run_ranks(tp_cases.run_all, 2, timeout_s=180)


@pytest.mark.parametrize("case", list(tp_cases.CASES))
def test_sequence_parallel_dtensor_boundaries(results, case):
    assert results[case] == "ok", results[case]
