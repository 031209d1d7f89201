"""modules mode: only the activations saved inside chosen submodules are offloaded; gradients equal
plain training; the report says what was expected and what the device got back."""
import copy

import pytest
import torch
from torch import nn

import torch_offload
from python_tests.support.devices import DEVICES
from python_tests.support.llama import _freeze_layer_weights, _steps_match_plain, _tiny_llama
from transformers.models.llama.modeling_llama import LlamaMLP

# Every test here runs with the C save hooks and with the Python ones (conftest.save_hooks).
pytestmark = pytest.mark.usefixtures("save_hooks")


def test_select_modules_by_pattern_and_type():
    model = _tiny_llama("cpu")
    names = [n for n, _ in torch_offload.select_modules(model, ["*.self_attn"])]
    assert names == [f"model.layers.{i}.self_attn" for i in range(3)]
    names = [n for n, _ in torch_offload.select_modules(model, [LlamaMLP, "*.layers.0.self_attn.q_proj"])]
    assert names == ["model.layers.0.self_attn.q_proj"] + [f"model.layers.{i}.mlp" for i in range(3)]
    # a module inside a selected one is not selected again
    names = [n for n, _ in torch_offload.select_modules(model, ["*.mlp", "*.mlp.up_proj"])]
    assert names == [f"model.layers.{i}.mlp" for i in range(3)]
    with pytest.raises(ValueError, match="no submodule matches"):
        torch_offload.select_modules(model, ["*.nonexistent"])
    with pytest.raises(TypeError, match="name patterns"):
        torch_offload.select_modules(model, [3])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("targets", [["*.self_attn"], [LlamaMLP], ["*.q_proj", "*.mlp.act_fn", "*.o_proj"]])
def test_modules_mode_matches_plain_training(device, targets):
    plain = _tiny_llama(device)  # dropout 0.1 inside attention: the RNG must not be disturbed
    ours = copy.deepcopy(plain)
    handle = torch_offload.apply(ours, mode="modules", targets=targets, min_bytes=0)
    _steps_match_plain(ours, plain, device)
    stats = handle.stats()
    assert stats["saves"] > 0 and stats["saves"] == stats["restores"]
    assert stats["live_handles"] == 0
    if device == "cuda":  # each selected call's copies were issued together (CPU copies at once)
        assert stats["batched_copies"] == stats["saves"]
        assert 0 < stats["copy_batches"] <= stats["saves"]
        if targets == ["*.self_attn"]:  # several copies per call
            assert stats["copy_batches"] < stats["saves"]


def test_each_selected_call_brackets_its_copies_in_a_batch(save_hooks, monkeypatch):
    # The Python hooks call the op through activations.offload_batch (the C ones from C): one
    # begin and one end per selected call, so each call's copies are issued when it returns.
    from torch_offload.hooks import offload_hooks as activations
    calls = []
    real = activations.offload_batch
    monkeypatch.setattr(activations, "offload_batch", lambda manager, begin: calls.append(begin) or real(manager, begin))
    model = _tiny_llama("cpu", dropout=0.0)
    handle = torch_offload.apply(model, mode="modules", targets=["*.self_attn"], min_bytes=0)
    assert handle.modules.hooks.batch_copies
    ids = torch.randint(0, 256, (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    assert calls == ([True, False] * 3 if save_hooks == "python" else [])
    with torch.no_grad():  # no hooks entered: no batch
        model(input_ids=ids)
    assert len(calls) == (6 if save_hooks == "python" else 0)


def _count_saves(model, ids, targets=None):
    if targets is not None:
        handle = torch_offload.apply(model, mode="modules", targets=targets, min_bytes=0)
    counted = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: counted.append(1) or t, lambda t: t):
        model(input_ids=ids, labels=ids).loss.backward()
    return len(counted), (handle.stats()["saves"] if targets is not None else None)


def test_only_activations_inside_the_targets_are_offloaded():
    # Everything the attention blocks save is offloaded (min_bytes=0), except the weights they
    # save; what the other modules save reaches the outer hooks unchanged.
    model = _tiny_llama("cpu", dropout=0.0)
    ids = torch.randint(0, 256, (2, 32))
    all_saved, _ = _count_saves(copy.deepcopy(model), ids)
    outside, offloaded = _count_saves(copy.deepcopy(model), ids, ["*.self_attn"])
    assert 0 < offloaded < all_saved
    assert outside + offloaded <= all_saved  # weights saved inside attention are kept, not offloaded
    assert outside > 0


class _SavesItsInput(nn.Module):
    """y = x * w: autograd saves x (for w's gradient) and w."""

    def __init__(self, width):
        super().__init__()
        self.w = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * self.w


class _TwoStage(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.first = _SavesItsInput(width)
        self.second = _SavesItsInput(width)

    def forward(self, x):
        hidden = torch.sin(x)  # lives only as long as what saves it
        return self.second(self.first(x) + hidden).sum()


def test_report_counts_what_the_device_got_back():
    # `first` saves the model input x, which the caller still holds: offloaded but not freed.
    # `second` saves a temporary that nothing else holds: offloaded and freed.
    model = _TwoStage(4096)
    handle = torch_offload.apply(model, mode="modules", targets=["first", "second"], min_bytes=0)
    x = torch.randn(4096)
    loss = model(x)
    report = handle.report()
    assert report == {"expected_bytes": 2 * 4096 * 4, "freed_bytes": 4096 * 4, "storages": 2}
    loss.backward()
    torch.testing.assert_close(model.first.w.grad, x * model.second.w)
    torch.testing.assert_close(model.second.w.grad, x * model.first.w + torch.sin(x))
    # The next forward starts a new report (the same two storages, not four).
    model(x).backward()
    assert handle.report()["storages"] == 2


def test_modules_mode_arguments_are_checked():
    model = _tiny_llama("cpu")
    with pytest.raises(ValueError, match="needs targets"):
        torch_offload.apply(model, mode="modules")
    with pytest.raises(TypeError, match="targets is for mode='modules'"):
        torch_offload.apply(model, mode="all", targets=["*.mlp"])
    with pytest.raises(RuntimeError, match="report\\(\\) is for mode='modules'"):
        torch_offload.apply(model, mode="hidden_states").report()


@pytest.mark.parametrize("device", DEVICES)
def test_modules_mode_with_layer_offloading(device):
    plain = _freeze_layer_weights(_tiny_llama(device, dropout=0.0))
    ours = copy.deepcopy(plain)
    handle = torch_offload.apply(ours, mode="modules", targets=["*.mlp"], min_bytes=0, layer_offloading=True)
    _steps_match_plain(ours, plain, device, steps=1)
    assert handle.stats()["saves"] > 0 and handle.layers.stats()["restores"] > 0


def test_modules_prefetches_eight_copies_ahead_unless_told():
    model = _tiny_llama("cpu")
    assert torch_offload.apply(copy.deepcopy(model), mode="modules", targets=["*.self_attn"]).manager.prefetch_depth() == 8
    handle = torch_offload.apply(copy.deepcopy(model), mode="modules", targets=["*.self_attn"], prefetch_depth=2)
    assert handle.manager.prefetch_depth() == 2
