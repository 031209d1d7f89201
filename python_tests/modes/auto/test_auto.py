"""mode="auto": the trial steps train exactly like gradient checkpointing, the plan is measured and
explained, the choice respects the budget, and errors name what the user wrote."""
import pytest
import torch

import torch_offload
from python_tests.support.devices import DEVICES
from python_tests.support.llama import _steps_match_plain, _tiny_llama


@pytest.mark.parametrize("device", DEVICES)
def test_auto_trains_like_checkpointing_through_every_trial_and_keeps_one(device):
    # Every candidate, checkpointing itself among them, gives checkpointing's gradients.
    ours, reference = _tiny_llama(device, 0.1), _tiny_llama(device, 0.1)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = torch_offload.apply(ours, "auto")
    # 4 candidates x 3 trial steps; the 13th step's forward closes the last trial and decides. On
    # CUDA, room under the budget adds trials of the fastest with saves kept on the GPU, its last
    # blocks left unchecked (the tail) or keeping their up/gate products (at most 13 trials).
    _steps_match_plain(ours, reference, device, steps=28 if device == "cpu" else 42)
    assert handle.auto.planned and [r.candidate for r in handle.auto.results][:4] == [
        "hidden_states", "selective:attention", "selective:attention+qkv+out_proj", "checkpointing"]
    extra_trials = handle.auto.results[4:]
    assert not extra_trials or (device == "cuda" and all(
        r.keep_on_device_bytes or r.tail_blocks or r.kept_mlp_blocks for r in extra_trials))
    assert sum(r.chosen for r in handle.auto.results) == 1
    assert handle.auto.chosen == next(r.trial for r in handle.auto.results if r.chosen)
    assert all(r.step_s == min(r.steps_s) > 0 and len(r.steps_s) == 2 for r in handle.auto.results)
    chosen = handle.auto.chosen.candidate
    assert handle.auto.current.blocks == list(ours.model.layers)[:3 - handle.auto.chosen.tail_blocks]
    assert (handle.manager is None) == (chosen == "checkpointing")
    table = handle.explain()
    assert "selective:attention+qkv+out_proj" in table and "| True |" in table
    if device == "cuda":
        # The default budget is checkpointing's peak, measured in its trial.
        assert handle.auto.budget_gb == handle.auto.results[3].peak_allocated_gb
        assert all(r.within_budget is not None for r in handle.auto.results)
    if handle.manager is not None:
        assert handle.stats()["saves"] > 0
    handle.remove()
    assert "forward" not in ours.model.layers[0].__dict__
    assert not ours._forward_pre_hooks


def test_auto_plans_only_on_training_steps():
    model = _tiny_llama("cpu", 0.0)
    handle = torch_offload.apply(model, "auto", trial_steps=1)
    ids = torch.randint(0, 256, (2, 32))
    model.eval()
    with torch.no_grad():
        for _ in range(5):
            model(input_ids=ids)
    assert handle.auto.results == [] and not handle.auto.planned
    model.train()
    for _ in range(5):
        model(input_ids=ids, labels=ids).loss.backward()
    assert handle.auto.planned and len(handle.auto.results) == 4
    handle.remove()


def test_auto_without_projections_tries_hidden_states_and_attention():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x).relu()

    model = torch.nn.Sequential(Block(), Block())
    handle = torch_offload.apply(model, "auto", blocks=list(model), trial_steps=1)
    x = torch.randn(4, 8, requires_grad=True)
    with pytest.warns(UserWarning, match="made no call to"):  # no attention in these blocks
        for _ in range(4):
            model(x).sum().backward()
    assert [r.candidate for r in handle.auto.results] == ["hidden_states", "selective:attention", "checkpointing"]
    handle.remove()


def test_auto_options_are_checked():
    model = _tiny_llama("cpu", 0.0)
    with pytest.raises(ValueError, match="manager= is not taken"):
        torch_offload.apply(model, "auto", manager=torch_offload.OffloadManager())
    with pytest.raises(ValueError, match="candidates=\\['selective'\\]"):
        torch_offload.apply(model, "auto", candidates=["selective"])
    with pytest.raises(ValueError, match="trial_steps=0"):
        torch_offload.apply(model, "auto", trial_steps=0)
    with pytest.raises(ValueError, match="memory_budget_gb=-1"):
        torch_offload.apply(model, "auto", memory_budget_gb=-1)
    with pytest.raises(TypeError, match="'prefetch_depth'.*sets each candidate's prefetch depth"):
        torch_offload.apply(model, "auto", prefetch_depth=2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (peak memory)")
def test_auto_keeps_the_lowest_peak_when_nothing_fits_the_budget():
    model = _tiny_llama("cuda", 0.0)
    handle = torch_offload.apply(model, "auto", trial_steps=1, memory_budget_gb=1e-6)
    ids = torch.randint(0, 256, (2, 32), device="cuda")
    with pytest.warns(UserWarning, match="no candidate's peak fits memory_budget_gb"):
        for _ in range(5):
            model(input_ids=ids, labels=ids).loss.backward()
    lowest = min(handle.auto.results, key=lambda r: r.peak_allocated_gb)
    assert lowest.chosen and not any(r.within_budget for r in handle.auto.results)
    handle.remove()
