"""apply(model, mode="hidden_states") on real model code: a Hugging Face Llama and a torchvision
ResNet. Gradients must equal torch's gradient checkpointing bit for bit (fp32, dropout active)."""
import copy

import pytest
import torch
import torchvision
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import torch_offload
from python_tests.support.devices import DEVICES
from python_tests.support.grads import assert_same_grads
from python_tests.support.llama import _llama_step, _tiny_llama


@pytest.mark.parametrize("device", DEVICES)
def test_llama_hidden_states_matches_gradient_checkpointing(device):
    ours = _tiny_llama(device)
    ref = copy.deepcopy(ours)
    ref.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = torch_offload.apply(ours, mode="hidden_states")
    ids = torch.randint(0, 256, (2, 48), device=device)
    for _ in range(2):  # two steps: the second runs on reused host buffers
        for m in (ours, ref):
            m.zero_grad(set_to_none=True)
        loss_ours = _llama_step(ours, ids, device)
        loss_ref = _llama_step(ref, ids, device)
        assert torch.equal(loss_ours, loss_ref)
        assert_same_grads(ours, ref)
    stats = handle.stats()
    assert stats["saves"] == 2 * 3 and stats["restores"] == 2 * 3
    assert stats["bytes_to_host"] == 2 * 3 * 2 * 48 * 64 * 4
    assert stats["live_handles"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_llama_hidden_states_matches_plain_training_without_dropout(device):
    ours = _tiny_llama(device, dropout=0.0)
    plain = copy.deepcopy(ours)
    torch_offload.apply(ours)
    ids = torch.randint(0, 256, (2, 32), device=device)
    assert torch.equal(_llama_step(ours, ids, device), _llama_step(plain, ids, device))
    assert_same_grads(ours, plain)


def _checkpoint_blocks_with_torch(blocks):
    for block in blocks:
        forward = block.forward
        block.forward = lambda *a, _f=forward, **k: torch_checkpoint(_f, *a, use_reentrant=False, **k)


@pytest.mark.parametrize("device", DEVICES)
def test_torchvision_resnet_with_given_blocks(device, monkeypatch):
    # cuDNN may pick non-deterministic convolution backwards: those differ run to run by themselves.
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    torch.manual_seed(0)
    ours = torchvision.models.resnet18(num_classes=10).to(device).train()
    ref = copy.deepcopy(ours)
    torch_offload.apply(ours, blocks=[ours.layer1, ours.layer2, ours.layer3, ours.layer4])
    _checkpoint_blocks_with_torch([ref.layer1, ref.layer2, ref.layer3, ref.layer4])
    x = torch.randn(2, 3, 64, 64, device=device)
    target = torch.tensor([1, 7], device=device)
    for model in (ours, ref):
        torch.nn.functional.cross_entropy(model(x), target).backward()
    assert_same_grads(ours, ref)
    # BatchNorm statistics are updated identically (both recompute in backward).
    assert torch.equal(ours.layer1[0].bn1.running_mean, ref.layer1[0].bn1.running_mean)


def test_apply_only_offloads_in_training_with_grad():
    model = _tiny_llama("cpu")
    handle = torch_offload.apply(model)
    ids = torch.randint(0, 256, (1, 16))
    model.eval()
    model(input_ids=ids, labels=ids).loss.backward()
    with torch.no_grad():
        model.train()
        model(input_ids=ids)
    assert handle.stats()["saves"] == 0
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    assert handle.stats()["saves"] == 3


def test_remove_restores_the_model():
    model = _tiny_llama("cpu")
    handle = torch_offload.apply(model)
    handle.remove()
    ids = torch.randint(0, 256, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    assert handle.stats()["saves"] == 0
    torch_offload.apply(model)  # can be applied again after remove()


def test_apply_replaces_hf_gradient_checkpointing_and_disables_cache():
    model = _tiny_llama("cpu")
    model.config.use_cache = True
    model.gradient_checkpointing_enable()
    with pytest.warns(UserWarning, match="use_cache=False"):
        torch_offload.apply(model)
    assert not model.is_gradient_checkpointing and model.config.use_cache is False


def test_apply_errors():
    model = _tiny_llama("cpu")
    with pytest.raises(ValueError, match="unknown mode 'everything'"):
        torch_offload.apply(model, mode="everything")
    with pytest.raises(ValueError, match="could not find the blocks of Sequential"):
        torch_offload.apply(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    layer = model.model.layers[0]
    with pytest.raises(ValueError, match="the same module more than once"):
        torch_offload.apply(model, blocks=[layer, layer])
    assert "forward" not in layer.__dict__  # nothing was wrapped
    torch_offload.apply(model)
    with pytest.raises(ValueError, match="already wrapped"):
        torch_offload.apply(model)
