"""Backward's first restores (the last block's saves) prefetched while the LM head's backward runs
(torch_offload/first_restores.py)."""
import copy

import pytest
import torch

import torch_offload
from python_tests.support.devices import cuda_only
from python_tests.support.llama import _steps_match_plain, _tiny_llama
from torch_offload.modes.first_restores import PrefetchFirstRestores


# modules mode needs its targets; min_bytes=0: the tiny model's attention saves are small.
_OPTIONS = {"hidden_states": {}, "selective": {}, "modules": {"targets": ["*.self_attn"], "min_bytes": 0}}


def _prefetch_hooks(module):
    return [hook for hook in module._forward_hooks.values() if isinstance(hook, PrefetchFirstRestores)]


@pytest.mark.parametrize("mode", list(_OPTIONS))
def test_the_lm_head_is_hooked_while_applied_and_a_copy_hooks_its_own_manager(mode):
    model = _tiny_llama("cpu", dropout=0.0)
    handle = torch_offload.apply(model, mode, **_OPTIONS[mode])
    (hook,) = _prefetch_hooks(model.lm_head)
    assert hook.manager is handle.manager
    twin, twin_handle = copy.deepcopy((model, handle))
    (twin_hook,) = _prefetch_hooks(twin.lm_head)
    assert twin_hook.manager is twin_handle.manager and twin_hook.manager is not handle.manager
    handle.remove()
    assert _prefetch_hooks(model.lm_head) == []
    twin_handle.remove()
    assert _prefetch_hooks(twin.lm_head) == []


def test_a_model_without_an_output_embedding_is_left_alone():
    blocks = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    handle = torch_offload.apply(blocks, "hidden_states", blocks=list(blocks))
    assert all(_prefetch_hooks(m) == [] for m in blocks.modules())
    handle.remove()


@cuda_only
@pytest.mark.parametrize("mode", list(_OPTIONS))
def test_every_restore_of_a_step_is_served_by_a_prefetch(mode):
    # Without the hook backward's first restores (the last block's saves, or the last selected
    # module's) are plain copies the compute stream waits for; with it they were started during the
    # LM head's backward. Gradients stay those of plain training. (128 tokens: selective's attention
    # output reaches min_bytes.)
    ours, plain = _tiny_llama("cuda", dropout=0.0), _tiny_llama("cuda", dropout=0.0)
    plain.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = torch_offload.apply(ours, mode, **_OPTIONS[mode])
    _steps_match_plain(ours, plain, "cuda", steps=1, shape=(2, 128))
    handle.manager.synchronize()
    stats = handle.stats()
    assert stats["restores"] > 0
    assert stats["prefetch_hits"] == stats["restores"]
    handle.remove()
