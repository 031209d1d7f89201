"""keep_layers_that_fit: after the first step at an input size, the layers whose frozen weights fit
in the room that step left keep their device copies; training still gives plain training's losses
and gradients bit for bit (fp32), and a larger input drops every kept copy before it runs."""
import copy

import pytest
import torch

import torch_offload
from torch_offload.config.errors import OptionTypeError
from torch_offload.layers.kept_layers import KeptLayers, StepStart, device_room, step_start
from python_tests.support.devices import DEVICES, cuda_only
from python_tests.support.llama import _freeze_layer_weights, _llama_step, _steps_match_plain, _tiny_llama

pytestmark = pytest.mark.usefixtures("save_hooks")


def _offloaded(device, room_layers=None):
    """A tiny Llama with its layers' weights frozen (the norms train) and a copy of it with layer
    offloading keeping what fits; `room_layers`: the room the policy sees, in layers (None: as
    measured on the device)."""
    plain = _freeze_layer_weights(_tiny_llama(device, dropout=0.0))
    ours = copy.deepcopy(plain)
    handle = torch_offload.apply(ours, "hidden_states", layer_offloading={"keep_layers_that_fit": True})
    if room_layers is not None:
        per_layer = handle.layers.layers[0].frozen_bytes
        handle.layers.kept.room = lambda device, start: room_layers * per_layer
    return plain, ours, handle


def _restores(handle) -> float:
    return handle.layers.stats()["restores"]


@pytest.mark.parametrize("device", DEVICES)
def test_layers_that_fit_stay_after_the_first_step_and_train_as_plain(device):
    plain, ours, handle = _offloaded(device, room_layers=2)
    seen = []
    _steps_match_plain(ours, plain, device, steps=4, after_step=lambda: seen.append(handle.layers.kept_layers))
    # The first step measures with every layer offloaded; the second keeps the two that fit.
    assert seen == [[], [0, 1], [0, 1], [0, 1]]
    before = _restores(handle)
    ids = torch.randint(0, 256, (2, 32), device=device)
    _llama_step(ours, ids, device)
    # Only the third layer's weights are copied: in its forward and in its recompute.
    assert _restores(handle) - before == 2 * len(handle.layers.layers[2].weights)
    for layer in handle.layers.layers[:2]:
        assert all(w.param.device.type == "cpu" for w in layer.weights)  # the parameters stay on the host


@pytest.mark.parametrize("device", DEVICES)
def test_a_larger_input_drops_the_kept_copies_and_measures_again(device):
    plain, ours, handle = _offloaded(device, room_layers=3)
    _steps_match_plain(ours, plain, device, steps=2)
    assert handle.layers.kept_layers == [0, 1, 2]
    kept_during = []
    handle.layers.layers[0].block.register_forward_hook(lambda *_: kept_during.append(handle.layers.kept_layers))
    _steps_match_plain(ours, plain, device, steps=2, shape=(2, 64))
    # Inside the first longer step nothing is kept; the next one keeps what fits again.
    assert kept_during[0] == [] and handle.layers.kept_layers == [0, 1, 2]
    # A shorter input keeps what was kept.
    _steps_match_plain(ours, plain, device, steps=1, shape=(2, 16))
    assert handle.layers.kept_layers == [0, 1, 2]


@pytest.mark.parametrize("device", DEVICES)
def test_no_room_keeps_nothing(device):
    plain, ours, handle = _offloaded(device, room_layers=0)
    _steps_match_plain(ours, plain, device, steps=3)
    assert handle.layers.kept_layers == []


@pytest.mark.parametrize("device", DEVICES)
def test_a_first_layer_that_trains_whole_still_lets_the_later_layers_be_kept(device):
    plain = _freeze_layer_weights(_tiny_llama(device, dropout=0.0))
    for p in plain.model.layers[0].parameters():
        p.requires_grad_(True)
    ours = copy.deepcopy(plain)
    handle = torch_offload.apply(ours, "hidden_states", layer_offloading={"keep_layers_that_fit": True})
    layers = handle.layers.layers
    assert layers[0].weights == [] and layers[0].frozen_bytes == 0
    handle.layers.kept.room = lambda device, start: 2 * layers[1].frozen_bytes
    seen = []
    _steps_match_plain(ours, plain, device, steps=3, after_step=lambda: seen.append(handle.layers.kept_layers))
    assert seen == [[], [1, 2], [1, 2]]


def test_remove_gives_back_the_weights_exactly_and_drops_the_kept_copies():
    plain, ours, handle = _offloaded("cpu", room_layers=3)
    _steps_match_plain(ours, plain, "cpu", steps=2)
    layers = handle.layers.layers
    handle.remove()
    assert all(w.kept is None for layer in layers for w in layer.weights)
    for (name, p), q in zip(ours.named_parameters(), plain.parameters()):
        assert torch.equal(p, q), name


def test_a_deep_copy_starts_offloaded_and_measures_its_own_steps():
    plain, ours, handle = _offloaded("cpu", room_layers=3)
    _steps_match_plain(ours, plain, "cpu", steps=2)
    twin = copy.deepcopy(ours)
    twin_layers = twin.model.layers[0]._torch_offload_layer
    assert twin_layers is not handle.layers and twin_layers.kept_layers == []
    assert isinstance(twin_layers.kept, KeptLayers) and twin_layers.kept.largest_size == 0
    _steps_match_plain(twin, plain, "cpu", steps=2)
    assert twin_layers.kept_layers == [0, 1, 2]


def test_long_context_keeps_what_fits_and_says_so_layer_offloading_alone_does_not():
    model = _freeze_layer_weights(_tiny_llama("cpu", dropout=0.0))
    handle = torch_offload.apply(copy.deepcopy(model), long_context=True)
    assert handle.layers.kept is not None
    assert "keep_layers_that_fit" in handle.explain()
    assert torch_offload.apply(model, "hidden_states", layer_offloading=True).layers.kept is None


def test_long_context_with_auto_offloads_every_layer_and_says_why():
    model = _freeze_layer_weights(_tiny_llama("cpu", dropout=0.0))
    handle = torch_offload.apply(model, "auto", long_context=True)
    assert handle.layers.kept is None and "measures its candidates' peaks" in handle.explain()


def test_keep_layers_that_fit_must_be_a_bool():
    with pytest.raises(OptionTypeError, match="keep_layers_that_fit"):
        torch_offload.LayerOffloadingOptions(keep_layers_that_fit="yes")


def test_the_room_off_cuda_is_none():
    assert device_room(torch.device("cpu"), StepStart(0, 0)) == 0


GB = 1 << 30


@pytest.mark.parametrize("held_at_peak, device_frees, room", [
    (30 * GB, 7, 14 * GB),  # memory given back, the peak kept: 40 free + 10 held - 30 at the peak - 1 - 5
    (10 * GB, 7, None),  # memory given back, then the peak reset: the step's peak is lost
    (10 * GB, 5, 34 * GB),  # the peak reset, nothing given back: the cache still holds what the step needed
])
def test_the_room_is_unknown_when_the_peak_was_reset_after_memory_went_back_to_the_device(
        monkeypatch, held_at_peak, device_frees, room):
    # A 100 GB GPU (so the margin is 5 GB) with 40 GB free; the allocator holds 10 GB now, of which
    # 1 GB more is allocated than when the measured step began.
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "mem_get_info", lambda device: (40 * GB, 100 * GB))
    monkeypatch.setattr(cuda, "memory_reserved", lambda device: 10 * GB)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda device: held_at_peak)
    monkeypatch.setattr(cuda, "memory_allocated", lambda device: 9 * GB)
    monkeypatch.setattr(cuda, "memory_stats", lambda device: {"num_device_free": device_frees})
    assert device_room(torch.device("cuda"), StepStart(allocated=8 * GB, device_frees=5)) == room


@pytest.mark.parametrize("device", DEVICES)
def test_an_unknown_room_measures_the_next_step_instead(device):
    plain, ours, handle = _offloaded(device)
    per_layer = handle.layers.layers[0].frozen_bytes
    answers = iter([None, 2 * per_layer])
    handle.layers.kept.room = lambda device, start: next(answers)
    seen = []
    _steps_match_plain(ours, plain, device, steps=4, after_step=lambda: seen.append(handle.layers.kept_layers))
    assert seen == [[], [], [0, 1], [0, 1]]


@cuda_only
def test_emptying_the_cache_and_resetting_the_peak_after_the_first_step_defers_keeping():
    plain, ours, handle = _offloaded("cuda")
    scratch_block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    _steps_match_plain(ours, plain, "cuda", steps=1)
    # A tiny model's step fits in segments that its weights keep in use, so nothing of its own would
    # go back: cache a block that empty_cache() can return, as a real step's activations would be.
    del scratch_block
    frees = torch.cuda.memory_stats()["num_device_free"]
    torch.cuda.empty_cache()
    assert torch.cuda.memory_stats()["num_device_free"] > frees  # the cached memory went back
    torch.cuda.reset_peak_memory_stats()
    _steps_match_plain(ours, plain, "cuda", steps=1)
    assert handle.layers.kept_layers == []  # the first step's peak was lost: the second one was measured
    _steps_match_plain(ours, plain, "cuda", steps=1)
    assert handle.layers.kept_layers == [0, 1, 2]


@cuda_only
def test_on_an_idle_gpu_every_layer_of_a_small_model_stays_and_nothing_is_copied():
    plain, ours, handle = _offloaded("cuda")
    assert device_room(torch.device("cuda"), step_start(torch.device("cuda"))) > 0
    _steps_match_plain(ours, plain, "cuda", steps=2)
    assert handle.layers.kept_layers == [0, 1, 2]
    before = _restores(handle)
    _llama_step(ours, torch.randint(0, 256, (2, 32), device="cuda"), "cuda")
    assert _restores(handle) == before
