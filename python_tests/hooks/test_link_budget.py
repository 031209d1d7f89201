"""mode="selective"'s link budget (link_throttle): the blocks past what the host link carries during
the forward recompute their policy's outputs instead of offloading them, and train exactly as before."""
import pytest
import torch

import torch_offload
from python_tests.support.devices import cuda_only
from python_tests.support.llama import _steps_match_plain, _tiny_llama
from torch_offload.config.errors import OptionTypeError
from torch_offload.config.mode_options import SelectiveOptions
from torch_offload.hooks import link_budget, node_link
from torch_offload.hooks.link_budget import policy_blocks_within


def test_the_first_blocks_offload_what_the_link_carries_after_the_block_inputs():
    margin = link_budget.MARGIN
    # 11 GB carried (10 usable), 2 GB of block inputs: 8 GB left, 3 GB per block -> 2 blocks.
    assert policy_blocks_within(11e9 * margin / 1.1, 2e9, 3e9, blocks=8) == 2
    assert policy_blocks_within(1e12, 2e9, 3e9, blocks=8) == 8  # the link carries every block's
    assert policy_blocks_within(1e9, 2e9, 3e9, blocks=8) == 0  # not even the block inputs
    assert policy_blocks_within(1e9, 2e9, 0.0, blocks=8) == 8  # the policy offloads nothing



def test_the_count_comes_from_a_forward_that_offloads_no_policy_output():
    # Forward 1: 8 blocks offload 1 GB of inputs and 3 GB of policy outputs each, and the host stalls
    # for most of its 2 s: not a measure of the compute. Forward 2 (the probe) offloads the inputs
    # alone in 1.2 s without a stall: at 10 GB/s the link carries 12 GB, 12/1.1 - 1 = 9.9 GB
    # after the inputs, 3 whole blocks' policy outputs.
    budget = link_budget.PolicyLinkBudget(manager=None, blocks=8)
    budget._counted = (1e9, 8)
    assert budget.decide(1e9 + 8 * 3e9, 2.0, 1.7, bandwidth=10e9) == 0  # the probe comes next
    assert budget.policy_bytes_per_block == 3e9 and not budget.decided
    budget._counted = (1e9, 0)
    assert budget.decide(1e9, 1.2, 0.0, bandwidth=10e9) == 3 and budget.decided
    budget._counted = (1e9, 3)
    assert budget.decide(1e9 + 3 * 3e9, 5.0, 0.0, bandwidth=1e15) == 3  # decided: kept

def test_the_throttle_is_off_unless_asked_for():
    model = _tiny_llama("cpu", 0.0)
    handle = torch_offload.apply(model, "selective")
    assert handle.link_budget is None
    handle.remove()
    with pytest.raises(OptionTypeError, match="link_throttle='yes'"):
        SelectiveOptions(link_throttle="yes")
    with pytest.raises(TypeError, match="link_throttle"):
        torch_offload.apply(_tiny_llama("cpu", 0.0), "selective", link_throttle=1)


def _saves_per_step(model, handle) -> int:
    before = handle.manager.stats()["saves"]
    ids = torch.randint(0, 256, (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    return handle.manager.stats()["saves"] - before


def test_blocks_past_the_budget_recompute_their_policy_outputs_and_train_exactly():
    ours, plain = _tiny_llama("cpu", 0.0), _tiny_llama("cpu", 0.0)
    handle = torch_offload.apply(ours, "selective", link_throttle=True, min_bytes=0)
    budget = handle.link_budget
    assert budget.blocks == budget.policy_blocks == 3
    every_block = _saves_per_step(ours, handle)
    budget.policy_blocks = 1  # as a budget of one block's policy outputs would set it
    first_block = _saves_per_step(ours, handle)
    assert first_block < every_block  # two blocks saved their input only
    _steps_match_plain(ours, plain, "cpu")
    budget.policy_blocks = 0
    _steps_match_plain(ours, plain, "cpu")
    assert budget.history == []  # on CPU nothing is measured
    handle.remove()
    assert not ours._forward_hooks and not ours._forward_pre_hooks


@cuda_only
def test_a_link_that_carries_nothing_leaves_every_policy_output_to_recompute(monkeypatch):
    ours, plain = _tiny_llama("cuda", 0.0), _tiny_llama("cuda", 0.0)
    # Projections: their products are offloaded whichever attention kernel runs.
    handle = torch_offload.apply(ours, "selective", policy="attention+qkv+out_proj", link_throttle=True, min_bytes=0)
    monkeypatch.setitem(node_link._bandwidth, torch.cuda.current_device(), 1.0)  # 1 byte/s
    _steps_match_plain(ours, plain, "cuda", steps=4)
    budget = handle.link_budget
    assert budget.policy_blocks == 0 and budget.policy_bytes_per_block > 0
    assert len(budget.history) == 3  # two forwards decide, a third keeps the count
    handle.remove()


@cuda_only
def test_a_link_that_carries_everything_keeps_every_block_offloading(monkeypatch):
    ours, plain = _tiny_llama("cuda", 0.0), _tiny_llama("cuda", 0.0)
    handle = torch_offload.apply(ours, "selective", policy="attention+qkv+out_proj", link_throttle=True, min_bytes=0)
    monkeypatch.setitem(node_link._bandwidth, torch.cuda.current_device(), 1e18)
    _steps_match_plain(ours, plain, "cuda", steps=3)
    assert handle.link_budget.policy_blocks == 3
    handle.remove()
