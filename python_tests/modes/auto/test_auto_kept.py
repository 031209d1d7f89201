"""mode="auto", per block: the last blocks keeping their MLP's up/gate products (auto_kept_products.py): the
plan's trials sized from the room and the bytes measured, and training like checkpointing."""
import dataclasses

import pytest
import torch

import torch_offload
from python_tests.support.devices import DEVICES, cuda_only
from python_tests.support.llama import _steps_match_plain, _tiny_llama
from torch_offload import AutoOptions
from torch_offload.install import installer_for
from torch_offload.modes.auto.candidates import install_trial
from torch_offload.modes.auto.kept_products import block_policies, can_keep_mlp, kept_policy, next_kept_trial
from torch_offload.modes.auto.trials import Trial, TrialResult

QKV_OUT = "selective:attention+qkv+out_proj"


def test_the_kept_policy_adds_the_up_gate_products_to_a_selective_candidate():
    assert kept_policy(QKV_OUT) == "attention+qkv+out_proj+keep_fc1"
    assert kept_policy("selective:attention") == "attention+keep_fc1"
    assert kept_policy("selective:attention_qkv") == "attention+qkv+keep_fc1"
    for candidate in ("hidden_states", "checkpointing", "selective:attention+fc1", "selective:attention+keep_fc1"):
        assert kept_policy(candidate) is None
    assert block_policies(QKV_OUT, 4, 1) == ["attention+qkv+out_proj"] * 3 + ["attention+qkv+out_proj+keep_fc1"]
    assert block_policies(QKV_OUT, 2, 0) == ["attention+qkv+out_proj"] * 2
    model = _tiny_llama("cpu", 0.0)
    assert can_keep_mlp(list(model.model.layers), QKV_OUT)
    assert not can_keep_mlp([torch.nn.Linear(2, 2)], QKV_OUT)
    assert not can_keep_mlp(list(model.model.layers), "hidden_states")


def _row(candidate, step_s, peak, early, keep=0, tail=0, kept=0, kept_gb=0.0, bytes_to_host=32 * 0.067e9):
    return TrialResult(Trial(candidate, keep, tail, kept), step_s=step_s, steps_s=[step_s], bytes_to_host=bytes_to_host,
                       kept_gb=kept_gb, peak_allocated_gb=peak, early_peak_gb=early)


def test_auto_plans_its_kept_trials_from_the_room_and_the_bytes_measured():
    # The Llama-3-8B shape at 8k with the loss's gradients in forward (32 blocks, budget 33.07 GB):
    # block inputs of 0.067 GB, up/gate products of 0.47 GB per block.
    window = int(0.61e9)
    plan = [_row("hidden_states", 1.07, 33.01, 21.0),
            _row(QKV_OUT, 1.01, 33.01, 21.3, bytes_to_host=9.7e9),
            _row("checkpointing", 1.08, 33.07, 23.0, bytes_to_host=0),
            _row(QKV_OUT, 0.998, 33.01, 21.9, keep=window, bytes_to_host=9.1e9),
            _row(QKV_OUT, 0.990, 33.01, 28.0, keep=window, tail=5)]  # tails do not seed kept trials
    step = lambda: next_kept_trial(plan, 33.07, 32, lambda c: True)  # noqa: E731
    # 90% of 11.17 GB of room at an estimated 8 block inputs (0.536 GB) per block: 18 blocks.
    assert step() == Trial(QKV_OUT, window, 0, 18)
    plan.append(_row(QKV_OUT, 0.975, 33.01, 30.36, keep=window, kept=18, kept_gb=18 * 0.47))
    # 90% of the 2.71 GB left at the 0.47 GB measured: 5 more.
    assert step() == Trial(QKV_OUT, window, 0, 23)
    plan.append(_row(QKV_OUT, 0.965, 33.5, 32.9, keep=window, kept=23, kept_gb=23 * 0.47))
    # 0.43 GB over: 2 blocks fewer (with the margin). Then the trials are used up.
    assert step() == Trial(QKV_OUT, window, 0, 21)
    plan.append(_row(QKV_OUT, 0.968, 33.02, 32.0, keep=window, kept=21, kept_gb=21 * 0.47))
    assert step() is None
    # Keeping that does not pay against its candidate without it stops the search.
    slow = plan[:5] + [dataclasses.replace(plan[5], step_s=1.0)]
    assert next_kept_trial(slow, 33.07, 32, lambda c: True) is None
    # Nothing to keep: no trial.
    assert next_kept_trial(plan[:5], 33.07, 32, lambda c: False) is None
    assert next_kept_trial([_row("hidden_states", 1.07, 33.01, 21.0)], 33.07, 32, lambda c: True) is None


@pytest.mark.parametrize("device", DEVICES)
def test_blocks_keeping_their_products_train_like_checkpointing(device):
    ours, reference = _tiny_llama(device, 0.1), _tiny_llama(device, 0.1)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    blocks = list(ours.model.layers)
    handle = install_trial(installer_for, ours, blocks, AutoOptions(), Trial(QKV_OUT, tail_blocks=1, kept_mlp_blocks=1))
    assert handle.blocks == blocks[:2]  # the last runs unchecked; the second keeps its products
    _steps_match_plain(ours, reference, device, steps=2)
    # Two steps of one block's gate and up products: 2 x (2 x 32 tokens x 128 floats).
    assert handle.stats()["policy_kept_bytes"] == 2 * 2 * (2 * 32 * 128 * 4)
    handle.remove()


@cuda_only
def test_auto_tries_keeping_the_up_gate_products_where_the_budget_leaves_room():
    ours, reference = _tiny_llama("cuda", 0.0), _tiny_llama("cuda", 0.0)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # 1 GB is far above the tiny model's peaks: the first kept trial takes every block.
    handle = torch_offload.apply(ours, "auto", trial_steps=1, memory_budget_gb=1.0, candidates=[QKV_OUT])
    _steps_match_plain(ours, reference, "cuda", steps=16)
    assert handle.auto.planned
    kept = [r for r in handle.auto.results if r.kept_mlp_blocks]
    assert kept and kept[0].kept_mlp_blocks == 3 and kept[0].tail_blocks == 0
    assert kept[0].kept_gb * 1e9 == 3 * 2 * (2 * 32 * 128 * 4)
    chosen = next(r for r in handle.auto.results if r.chosen)
    assert handle.auto.chosen.kept_mlp_blocks == chosen.kept_mlp_blocks
    assert "last blocks keeping up/gate" in handle.explain()
    handle.remove()
    assert all("forward" not in block.__dict__ for block in ours.model.layers)
