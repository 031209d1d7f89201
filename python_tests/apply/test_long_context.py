"""apply(model, long_context=True): the chunked loss, the tiled MLP, layer offloading of a frozen base
and a host budget with spill to disk, turned on together; training as plain checkpointing does (fp32,
within the tiles' summation bound), explain() naming each choice, remove() undoing all of it."""
import copy
import os
import tempfile

import pytest
import torch

import torch_offload
from python_tests.support.devices import DEVICES, cuda_only
from python_tests.support.llama import _tiny_llama
from python_tests.support.tiled_training import _assert_same_training, _step

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _lora(device):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, init_lora_weights=False)
    return peft.get_peft_model(_tiny_llama(device, 0.0), config)


def _checkpointed(model):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    return model


# The names whose gradients are compared to the tiles' summation bound rather than to the bit: with
# the norms tiled too, every gradient (a norm's output feeds each projection, and its backward every
# gradient below it); CPU kernels reduce a row's sum differently by the tensor's size.
EVERY_GRADIENT = [""]


@pytest.mark.parametrize("device", DEVICES)
def test_lora_trains_as_checkpointing_with_every_part_on(device):
    reference = _lora(device)
    ours = copy.deepcopy(reference)
    _checkpointed(reference)
    handle = torch_offload.apply(ours, long_context={"tile_tokens": 100})
    ids = torch.randint(0, 256, (1, 260), device=device)
    for _ in range(2):
        ref, got = _step(reference, ids), _step(ours, ids)
        assert got[1] and all("lora_" in name for name in got[1])
        _assert_same_training(ref, got, EVERY_GRADIENT)
    assert handle.mode == "hidden_states" and handle.stats()["saves"] > 0
    assert handle.chunked_loss is not None and handle.layers is not None and handle.layers.offloaded_bytes > 0
    assert all(p.device.type == "cpu" for layer in handle.layers.layers for p in layer.block.parameters()
               if not p.requires_grad)
    assert len(handle.tiled_mlp.mlps) == 3
    text = handle.explain()
    assert len(handle.tiled_norms.mlps) == 6  # input and post-attention norm of each layer
    for part in ("activation mode | hidden_states", "chunked loss | on", "tiled MLP | on", "tiled norms | on",
                 "layer offloading | on", "host budget |"):
        assert part in text, text
    # Beyond the budget, boundaries spill to unnamed files in the temp dir: no folder is made, so
    # nothing is left behind however the process ends.
    assert handle.manager.disk_dir() == tempfile.gettempdir()
    before = set(os.listdir(tempfile.gettempdir()))
    handle.remove()
    assert set(os.listdir(tempfile.gettempdir())) <= before
    assert all("forward" not in m.__dict__ for m in ours.modules())
    # The model as before apply(): its own loss, logits and weights on the device.
    assert all(p.device.type == device for p in ours.parameters())
    assert ours(input_ids=ids, labels=ids).logits is not None


def test_what_the_user_said_wins():
    model = _lora("cpu")
    handle = torch_offload.apply(model, "selective", layer_offloading=False, chunked_loss=False,
                                 long_context=True, host_budget_bytes=1 << 30)
    text = handle.explain()
    assert "activation mode | selective | as given" in text
    assert "layer offloading | off | as given" in text and handle.layers is None
    assert "chunked loss | off | as given" in text and handle.chunked_loss is None
    assert "host budget | 1.0 GiB, then disk | as given (host_budget_bytes=1073741824); beyond it the " \
           "boundaries spill to " in text
    assert handle.manager.disk_dir() == tempfile.gettempdir()  # no disk_dir given: unnamed files there
    handle.remove()


def test_a_model_without_frozen_weights_or_loss_gets_what_applies():
    model = _tiny_llama("cpu", 0.0).model  # the decoder alone: no LM head, every parameter trains
    handle = torch_offload.apply(model, long_context=True)
    text = handle.explain()
    assert "layer offloading | off | every parameter of the blocks trains" in text
    assert "chunked loss | off | not a causal LM" in text and "tiled MLP | on" in text
    hidden = model(input_ids=torch.randint(0, 256, (1, 40))).last_hidden_state
    hidden.sum().backward()
    handle.remove()


def test_boundaries_beyond_the_host_budget_spill_to_disk_and_train_alike(tmp_path):
    reference = _lora("cpu")
    ours = copy.deepcopy(reference)
    _checkpointed(reference)
    ids = torch.randint(0, 256, (1, 260))
    boundary = ids.numel() * ours.config.hidden_size * 4
    # Room for one block input in host memory: the other two go to files.
    handle = torch_offload.apply(ours, long_context={"tile_tokens": 100}, host_budget_bytes=boundary,
                                 disk_dir=str(tmp_path))
    for _ in range(2):
        handle.manager.reset_stats()
        _assert_same_training(_step(reference, ids), _step(ours, ids), EVERY_GRADIENT)
        stats = handle.stats()
        assert stats["spills"] > 0 and stats["disk_bytes_written"] > 0 and stats["bytes_to_host"] > 0
        assert stats["live_handles"] == 0
    assert f"{tmp_path} (as given)" in handle.explain()
    handle.remove()
    assert tmp_path.exists()  # the user's folder stays


def test_tile_sizes_chosen_are_listed():
    model = _lora("cpu")
    handle = torch_offload.apply(model, long_context=True)
    ids = torch.randint(0, 256, (1, 3000))  # on CPU the tiles' intermediates stay within the input's size
    _step(model, ids)
    tiles = handle.tiled_mlp.tiles()
    assert list(tiles) == [3000] and tiles[3000] < 3000
    assert f"tokens per MLP tile, by sequence length: 3000: {tiles[3000]}" in handle.explain()
    # A norm's tile: its three float32 intermediates of the hidden size within the input's size.
    norm_tiles = handle.tiled_norms.tiles()
    assert list(norm_tiles) == [3000] and 3 * norm_tiles[3000] * 4 <= 3000 * 2 * 4
    assert f"tokens per norm tile, by sequence length: 3000: {norm_tiles[3000]}" in handle.explain()
    handle.remove()


def test_errors_name_the_argument():
    model = _tiny_llama("cpu", 0.0)
    with pytest.raises(TypeError, match=r"long_context=\{'tile': 4\} has unknown keys \['tile'\]"):
        torch_offload.apply(model, long_context={"tile": 4})
    with pytest.raises(ValueError, match=r"long_context='yes'; expected True, False, a dict"):
        torch_offload.apply(model, long_context="yes")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'long_contxt' \(did you mean long_context=\?\)"):
        torch_offload.apply(model, long_contxt=True)
    with pytest.raises(ValueError, match="tile_tokens=0"):
        torch_offload.apply(model, long_context={"tile_tokens": 0})
    # Nothing was left behind by the refused calls.
    assert all("forward" not in m.__dict__ for m in model.modules())
    handle = torch_offload.apply(model)
    with pytest.raises(RuntimeError, match=r"explain\(\) is for apply\(..., long_context=True\)"):
        handle.explain()
    handle.remove()


@cuda_only
def test_bf16_gradients_are_within_the_noise_floor_of_checkpointing():
    # The noise floor: how far bf16 checkpointing's gradients are from fp32 training's. bf16 training
    # with every long_context part on (small tiles: 5 per MLP) stays within it.
    base = _tiny_llama("cuda", 0.0)
    ids = torch.randint(0, 256, (1, 320), device="cuda")

    def flat(model):
        _step(model, ids)
        return torch.cat([p.grad.float().flatten() for p in model.parameters()])

    reference = flat(copy.deepcopy(base))
    checkpointing = _checkpointed(copy.deepcopy(base).to(torch.bfloat16))
    ours = copy.deepcopy(base).to(torch.bfloat16)
    handle = torch_offload.apply(ours, long_context={"tile_tokens": 64})
    floor = ((flat(checkpointing) - reference).norm() / reference.norm()).item()
    error = ((flat(ours) - reference).norm() / reference.norm()).item()
    assert 0 < floor < 0.05 and error <= 1.5 * floor, (error, floor)
    assert handle.stats()["saves"] > 0 and handle.tiled_mlp.tiles() == {}  # fixed tiles: none chosen
    handle.remove()
