"""mode="auto", per block: an unchecked tail (the last blocks keep their activations and skip the
recompute) trains exactly like gradient checkpointing, its length follows the measured room under
the budget, and the probe that measures that room reads what it should."""
import dataclasses

import pytest
import torch

import torch_offload
from python_tests.support.devices import DEVICES, cuda_only
from torch_offload import AutoOptions
from torch_offload.install import installer_for
from torch_offload.modes.auto.candidates import install_trial
from torch_offload.modes.auto.trials import Trial, TrialResult
from torch_offload.modes.auto.unchecked_tail import TailProbe, first_tail, next_tail, next_tail_trial, window_for_one_more_block
from python_tests.support.llama import _llama_step, _steps_match_plain, _tiny_llama


def test_the_first_tail_is_one_block_where_the_early_phase_has_room():
    # budget 33 GB, early peak 28 GB, an 80 GB device, block inputs of 0.07 GB, 32 blocks
    assert first_tail(33.0, 28.0, 80.0, 0.07, 32) == 1
    assert first_tail(33.0, 32.0, 80.0, 0.07, 32) == 0  # room for 13 block inputs: not a block's worth
    assert first_tail(33.0, 28.0, 34.0, 0.07, 32) == 0  # the device could not take an unknown block
    assert first_tail(33.0, None, 80.0, 0.07, 32) == 0  # no early peak measured (CPU)
    assert first_tail(33.0, 28.0, 80.0, 0.07, 1) == 0  # a single block stays checkpointed


def test_the_next_tail_follows_the_room_or_the_excess():
    # Within the budget: as many more blocks as 90% of the early phase's room takes.
    assert next_tail(33.0, 1, 30.0, 29.0, 1.0, 32, [1]) == 1 + 3
    # Over it: fewer, by the excess plus a margin.
    assert next_tail(33.0, 4, 34.5, 33.5, 1.0, 32, [1, 4]) == 4 - 2
    # Never all blocks, never a length tried already, nothing without a footprint.
    assert next_tail(33.0, 1, 10.0, 5.0, 1.0, 8, [1]) == 7
    assert next_tail(33.0, 1, 30.0, 32.5, 1.0, 32, [1]) == 0
    assert next_tail(33.0, 1, 30.0, 29.0, None, 32, [1]) == 0
    assert next_tail(33.0, 2, 40.0, 40.0, 1.0, 32, [1, 2]) == 0


def test_part_of_the_window_makes_room_for_one_more_block():
    # 1.5 GB of room (90% of 33 - 31.33) for a 1.7 GB block: 0.2 GB of a 0.6 GB window goes.
    assert window_for_one_more_block(33.0, 31.333, 1.7, int(0.6e9)) == pytest.approx(0.4e9, abs=1e6)
    assert window_for_one_more_block(33.0, 31.333, 1.7, int(0.1e9)) is None  # the window is too small
    assert window_for_one_more_block(33.0, 20.0, 1.7, int(0.6e9)) is None  # room enough without trading
    assert window_for_one_more_block(33.0, 31.333, 1.7, 0) is None


def _row(candidate, step_s, peak, early, keep=0, tail=0, block=None, bytes_to_host=32 * 0.067e9):
    return TrialResult(Trial(candidate, keep, tail), step_s=step_s, steps_s=[step_s], bytes_to_host=bytes_to_host,
                       peak_allocated_gb=peak, early_peak_gb=early, tail_block_gb=block)


def test_auto_plans_its_tail_trials_from_the_rows_measured():
    # The Llama-3-8B shape at 8k as measured (32 blocks, budget 33.07 GB, an 80 GB device).
    plan = [_row("hidden_states", 1.105, 33.01, 29.01),
            _row("selective:attention+qkv+out_proj", 1.053, 33.01, 29.08, bytes_to_host=9.7e9),
            _row("checkpointing", 1.101, 33.07, 31.16, bytes_to_host=0),
            _row("selective:attention+qkv+out_proj", 1.048, 33.01, 29.68, keep=int(0.61e9), bytes_to_host=9.1e9)]
    step = lambda: next_tail_trial(plan, 33.07, 32, 80.0)  # noqa: E731
    assert step() == Trial("selective:attention+qkv+out_proj", int(0.61e9), 1)  # from the fastest row
    plan.append(_row("selective:attention+qkv+out_proj", 1.038, 33.01, 31.40, keep=int(0.61e9), tail=1, block=1.71))
    # 1.50 GB of room is short of a 1.71 GB block: part of the window makes it up.
    trial = step()
    candidate, keep, tail = trial.candidate, trial.keep_on_device_bytes, trial.tail_blocks
    assert tail == 2 and keep == pytest.approx(0.61e9 - 0.207e9, abs=2e6)
    plan.append(_row(candidate, 1.024, 33.05, 32.9, keep=keep, tail=2, block=1.71))
    assert step() is None  # within the budget, no room, no window left to trade
    plan[-1].peak_allocated_gb = 34.0  # had it gone over: one block fewer, tried already
    assert step() is None
    # A tail that is not faster than its candidate without one stops the search.
    slow = plan[:5]
    slow[-1] = dataclasses.replace(slow[-1], step_s=1.06)
    assert next_tail_trial(slow, 33.07, 32, 80.0) is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("candidate", ["hidden_states", "selective:attention", "checkpointing"])
def test_an_unchecked_tail_trains_like_checkpointing(device, candidate):
    ours, reference = _tiny_llama(device, 0.1), _tiny_llama(device, 0.1)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    blocks = list(ours.model.layers)
    handle = install_trial(installer_for, ours, blocks, AutoOptions(), Trial(candidate, tail_blocks=2))
    assert handle.blocks == blocks[:1]  # the last two run as they are
    assert all("forward" not in block.__dict__ for block in blocks[1:])
    _steps_match_plain(ours, reference, device, steps=2)
    handle.remove()


@cuda_only
def test_the_probe_reads_the_early_peak_and_a_tail_blocks_footprint():
    model = _tiny_llama("cuda", 0.0)
    blocks = list(model.model.layers)
    handle = install_trial(installer_for, model, blocks, AutoOptions(), Trial("hidden_states", tail_blocks=1))
    probe = TailProbe(blocks[-1], blocks[-1:])
    ids = torch.randint(0, 256, (2, 32), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    _llama_step(model, ids, "cuda")
    # The tail block keeps at least its MLP's intermediate products (2 x 32 x 128 floats, several).
    assert probe.block_gb is not None and probe.block_gb * 1e9 >= 4 * 2 * 32 * 128 * 4
    assert probe.early_peak_gb is not None and 0 < probe.early_peak_gb <= torch.cuda.max_memory_allocated() / 1e9
    probe.remove()
    handle.remove()


@cuda_only
def test_auto_tries_an_unchecked_tail_where_the_budget_leaves_room():
    ours, reference = _tiny_llama("cuda", 0.0), _tiny_llama("cuda", 0.0)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # 1 GB is far above the tiny model's peaks: the tail grows to every block but one.
    handle = torch_offload.apply(ours, "auto", trial_steps=1, memory_budget_gb=1.0,
                                 candidates=["hidden_states", "checkpointing"])
    _steps_match_plain(ours, reference, "cuda", steps=12)
    assert handle.auto.planned
    tails = [r for r in handle.auto.results if r.tail_blocks]
    assert tails and tails[0].tail_blocks == 1 and tails[0].tail_block_gb > 0
    assert all(r.early_peak_gb <= r.peak_allocated_gb for r in handle.auto.results)
    if len(tails) > 1:
        assert tails[1].tail_blocks == 2  # 3 blocks: all but one
    chosen = next(r for r in handle.auto.results if r.chosen)
    assert handle.auto.chosen.tail_blocks == chosen.tail_blocks
    assert len(handle.auto.current.blocks) == 3 - chosen.tail_blocks
    assert "unchecked last blocks" in handle.explain()
    handle.remove()
    assert all("forward" not in block.__dict__ for block in ours.model.layers)
