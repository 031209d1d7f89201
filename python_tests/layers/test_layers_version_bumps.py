"""Layer offloading and a forward that bumps a frozen weight's version: a bump that leaves the
values unchanged (torch's parametrizations, which PEFT's LoRA on MoE experts and routers registers
around every forward, set_() the weight to itself) trains as without offloading; a real change,
which offloading would lose, is still an error."""
import copy

import pytest
import torch
from torch.nn.utils import parametrize

import torch_offload
from torch_offload.hooks import weight_tokens
from python_tests.support.llama import _freeze_layer_weights, _steps_match_plain, _tiny_llama

IDS_SHAPE = (2, 32)


class _Identity(torch.nn.Module):
    def forward(self, weight):
        return weight


def _set_to_itself(mlp):
    with torch.no_grad():
        mlp.up_proj.weight.set_(mlp.up_proj.weight)


def _copy_of_itself(mlp):
    with torch.no_grad():
        mlp.up_proj.weight.copy_(mlp.up_proj.weight.clone())


def _parametrized(mlp):
    # What PEFT's ParamWrapper does: registering moves the weight into the parametrization (set_()
    # to itself), removing puts the same tensor back.
    parametrize.register_parametrization(mlp.up_proj, "weight", _Identity())
    parametrize.remove_parametrizations(mlp.up_proj, "weight", leave_parametrized=False)


def _with_hook(model, bump, bumps: list):
    def hook(mlp, args):
        before = mlp.up_proj.weight._version
        bump(mlp)
        bumps.append(mlp.up_proj.weight._version != before)

    for layer in model.model.layers:
        layer.mlp.register_forward_pre_hook(hook)
    return model


@pytest.mark.parametrize("bump", [_set_to_itself, _copy_of_itself, _parametrized], ids=lambda f: f.__name__[1:])
def test_a_version_bump_that_keeps_the_values_trains_as_without_offloading(bump):
    plain = _freeze_layer_weights(_tiny_llama("cpu", dropout=0.0))
    ours = copy.deepcopy(plain)
    bumps = []
    _with_hook(plain, bump, [])
    _with_hook(ours, bump, bumps)
    handle = torch_offload.offload_layers(ours)
    _steps_match_plain(ours, plain, "cpu")
    assert bumps and all(bumps), "the hook bumped the device copy's version in every forward"
    assert handle.stats()["live_handles"] == len([w for layer in handle.layers for w in layer.weights])


def _set_to_zeros(mlp):
    with torch.no_grad():
        mlp.up_proj.weight.set_(torch.zeros_like(mlp.up_proj.weight))


def _bump_then_write(mlp):
    with torch.no_grad():
        mlp.up_proj.weight.set_(mlp.up_proj.weight)
        mlp.up_proj.weight.mul_(2)


def _one_element(mlp):
    with torch.no_grad():
        mlp.up_proj.weight[3, 5] += 1


def _negative_zero(mlp):
    # Equal as values (-0.0 == 0.0), not as bits: the host copy would keep +0.0.
    with torch.no_grad():
        mlp.up_proj.weight[0, 0] = -0.0


@pytest.mark.parametrize("change", [_set_to_zeros, _bump_then_write, _one_element, _negative_zero],
                         ids=lambda f: f.__name__[1:])
def test_a_real_change_during_the_forward_is_still_an_error(change):
    model = _freeze_layer_weights(_tiny_llama("cpu", dropout=0.0))
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = 0.0
    host_before = model.model.layers[1].mlp.up_proj.weight.detach().clone()
    torch_offload.offload_layers(model)
    model.model.layers[1].mlp.register_forward_pre_hook(lambda mlp, args: change(mlp))
    ids = torch.randint(0, 256, IDS_SHAPE)
    with pytest.raises(RuntimeError, match=r"model\.layers\.1\.mlp\.up_proj\.weight was modified in place during "
                                           "the forward"):
        model(input_ids=ids, labels=ids)
    # Nothing stays registered as a weight, not even the address the set_() left behind: a later
    # tensor allocated there would be saved as this weight.
    assert not weight_tokens.installed()
    host = model.model.layers[1].mlp.up_proj.weight
    assert torch.equal(host.view(torch.int32), host_before.view(torch.int32)), "the host weight was kept"
