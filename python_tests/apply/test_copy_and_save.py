"""copy.deepcopy and torch.save of a model that apply() or offload_layers() changed (EMA and
teacher copies): the copy computes with its own weights, still offloads (through its own manager),
and pickling says to call remove() first."""
import copy
import io

import pytest
import torch

import torch_offload
from python_tests.support.grads import assert_same_grads
from python_tests.support.llama import _freeze_layer_weights, _llama_step, _tiny_llama

# "layer_offloading": apply("all", layer_offloading=True), our wrapper around offload_layers' one.
MODES = ["hidden_states", "all", "sync", "disk", "modules", "selective", "offload_layers", "layer_offloading"]
# min_bytes=0: the tiny model's activations are all under the default threshold. "modules" with
# core_attn: the copy also has the hooks of the projections core_attn leaves out.
OPTIONS = {"hidden_states": {}, "all": {"min_bytes": 0}, "sync": {"min_bytes": 0}, "disk": {"min_bytes": 0},
           "modules": {"targets": ["*.mlp"], "presets": ["core_attn"], "min_bytes": 0}, "selective": {"min_bytes": 0}}
IDS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))


def _applied(mode, tmp_path):
    """A tiny Llama (no dropout) with `mode` applied, and the handle."""
    if mode in ("offload_layers", "layer_offloading"):
        model = _freeze_layer_weights(_tiny_llama("cpu", dropout=0.0))
        if mode == "layer_offloading":
            return model, torch_offload.apply(model, "all", layer_offloading=True, min_bytes=0)
        return model, torch_offload.offload_layers(model)
    model = _tiny_llama("cpu", dropout=0.0)
    disk = {"disk_dir": str(tmp_path)} if mode == "disk" else {}
    return model, torch_offload.apply(model, mode, **OPTIONS[mode], **disk)


def _restores(handle) -> int:
    """Tensors the handle's manager brought back since its last reset: every mode restores in
    backward (activations, block inputs or frozen weights)."""
    return handle.stats()["restores"]


def _reset(*handles):
    for handle in handles:
        torch_offload.reset_stats(handle.manager)


def _assert_same_state(state, expected):
    assert list(state) == list(expected)
    for name in expected:
        assert torch.equal(state[name], expected[name]), name


def _step(model):
    model.zero_grad(set_to_none=True)
    return _llama_step(model, IDS, "cpu")


def _scale_block_weights(model, factor):
    """Changes weights inside the decoder layers (the wrapped blocks) that every mode lets change:
    the norms (trainable, and on the device, in offload_layers' frozen base too)."""
    with torch.no_grad():
        for name, p in model.model.layers.named_parameters():
            if "norm" in name:
                p.mul_(factor)


@pytest.mark.parametrize("mode", MODES)
def test_deepcopy_computes_with_its_own_weights_and_still_offloads(mode, tmp_path):
    model, handle = _applied(mode, tmp_path)
    twin, twin_handle = copy.deepcopy((model, handle))  # the copy's handle comes with it
    assert twin_handle.model is twin and twin_handle.manager.id() != handle.manager.id()
    loss = _step(model)
    assert torch.equal(_step(twin), loss)
    assert_same_grads(twin, model)

    _reset(handle, twin_handle)
    _scale_block_weights(twin, 1.5)
    changed = _step(twin)
    assert not torch.equal(changed, loss)
    assert _restores(twin_handle) > 0 and _restores(handle) == 0  # the copy offloads, through its own manager
    assert torch.equal(_step(model), loss)  # the original still computes with its own weights
    assert _restores(handle) == _restores(twin_handle)

    _scale_block_weights(model, 0.5)
    assert not torch.equal(_step(model), loss)
    assert torch.equal(_step(twin), changed)


@pytest.mark.parametrize("mode", MODES)
def test_deepcopy_of_the_model_alone_trains_like_the_original(mode, tmp_path):
    model, handle = _applied(mode, tmp_path)
    twin = copy.deepcopy(model)
    _reset(handle)
    loss = _step(twin)
    assert _restores(handle) == 0  # not through the original's manager
    assert torch.equal(_step(model), loss)
    assert_same_grads(twin, model)


@pytest.mark.parametrize("mode", MODES)
def test_the_copys_handle_removes_offloading_from_the_copy_only(mode, tmp_path):
    model, handle = _applied(mode, tmp_path)
    twin, twin_handle = copy.deepcopy((model, handle))
    twin_handle.remove()
    assert all("forward" not in block.__dict__ for block in twin.model.layers)
    _reset(handle, twin_handle)
    assert torch.equal(_step(twin), _step(model))
    assert _restores(twin_handle) == 0 and _restores(handle) > 0
    assert_same_grads(twin, model)


@pytest.mark.parametrize("mode", MODES)
def test_torch_save_says_to_remove_first(mode, tmp_path):
    model, handle = _applied(mode, tmp_path)
    with pytest.raises(TypeError, match=r"torch\.save\(model\).*handle\.remove\(\) first.*state_dict\(\)"):
        torch.save(model, io.BytesIO())
    state = io.BytesIO()
    torch.save(model.state_dict(), state)  # the weights themselves, whatever offloads them
    handle.remove()
    saved = io.BytesIO()
    torch.save(model, saved)
    saved.seek(0), state.seek(0)
    loaded = torch.load(saved, weights_only=False)
    _assert_same_state(loaded.state_dict(), torch.load(state))
    assert torch.equal(_step(loaded), _step(model))


def test_deepcopy_of_layer_offloading_on_the_disk_tier(tmp_path):
    # The copy's frozen weights get host copies of their own in a manager like the original's,
    # here spilling to disk as the original's do.
    model = _freeze_layer_weights(_tiny_llama("cpu", dropout=0.0))
    manager = torch_offload.OffloadManager(host_budget_bytes=64 << 10, disk_dir=str(tmp_path))
    handle = torch_offload.offload_layers(model, manager=manager)
    twin, twin_handle = copy.deepcopy((model, handle))
    assert twin_handle.stats()["spills"] == handle.stats()["spills"] > 0
    _assert_same_state(twin.state_dict(), model.state_dict())
    assert torch.equal(_step(twin), _step(model))
    handle.remove()
    twin_handle.remove()
    _assert_same_state(twin.state_dict(), model.state_dict())
