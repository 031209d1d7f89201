"""KV caches off while a recomputing mode is applied, in every config a model's forwards read (T5's
decoder stack keeps a config of its own, a vision-language model's language model the text
sub-config), back on after remove(); and a recompute that saves a different number of tensors than
the forward names the likely cause."""
import copy
import warnings

import pytest
import torch
from torch.utils.checkpoint import CheckpointError

import torch_offload
from python_tests.support.grads import assert_same_grads
from python_tests.support.model_zoo import ARCHITECTURES, loss
from torch_offload.checkpointing.nonreentrant import available as c_checkpoint_available
from torch_offload.kv_cache import caches_to_disable

pytest.importorskip("peft")
BUILD = {arch.name: arch.build for arch in ARCHITECTURES}


def _where(model) -> list:
    return [cache.where for cache in caches_to_disable(model)]


def test_the_caches_found_are_every_config_a_forward_reads():
    import peft
    t5, _ = BUILD["T5"]()
    assert t5.decoder.config is not t5.config and t5.decoder.config.use_cache
    assert _where(t5) == ["config", "decoder.config"]
    wrapped = peft.get_peft_model(BUILD["T5"]()[0], peft.LoraConfig(r=4, target_modules="all-linear"))
    assert _where(wrapped) == ["config", "base_model.model.decoder.config"]
    vision_language, _ = BUILD["Qwen2.5-VL"]()
    assert _where(vision_language) == ["config.text_config"]
    assert vision_language.model.language_model.config is vision_language.config.text_config
    llama, _ = BUILD["Llama"]()
    llama.config.use_cache = False
    assert _where(llama) == []
    flux, _ = BUILD["Flux"]()  # a diffusers model: no KV cache
    assert _where(flux) == []


def test_apply_turns_every_cache_off_and_remove_turns_them_back_on():
    model, batch = BUILD["T5"]()
    reference = copy.deepcopy(model)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with pytest.warns(UserWarning, match=r"setting config\.use_cache=False, decoder\.config\.use_cache=False"):
        handle = torch_offload.apply(model, "hidden_states")
    assert not model.config.use_cache and not model.decoder.config.use_cache
    torch.manual_seed(0)
    loss(model, batch).backward()  # the decoder's recompute fills no cache: it saves what its forward did
    torch.manual_seed(0)
    loss(reference, batch).backward()
    assert_same_grads(model, reference)
    handle.remove()
    assert model.config.use_cache and model.decoder.config.use_cache


def test_gradient_checkpointing_enable_turns_every_cache_off_too():
    from torch_offload.integrations import gradient_checkpointing_enable
    model, batch = BUILD["T5"]()
    with pytest.warns(UserWarning, match=r"gradient_checkpointing_enable: setting config\.use_cache=False, "
                                         r"decoder\.config\.use_cache=False"):
        handle = gradient_checkpointing_enable(model)
    assert not model.config.use_cache and not model.decoder.config.use_cache
    loss(model, batch).backward()
    handle.remove()
    assert model.config.use_cache and model.decoder.config.use_cache


def test_a_recompute_saving_a_different_number_of_tensors_names_the_likely_cause():
    if not c_checkpoint_available():
        pytest.skip("torch's checkpoint runs where the C hooks are not built: torch's message")
    calls = []

    def block(x):
        calls.append(x)
        y = x.sin()
        if len(calls) == 1:  # state that changes between the forward and the recompute
            y = y.cos()
        return y.exp()

    x = torch.randn(8, requires_grad=True)
    out = torch_offload.checkpoint(block, x, use_reentrant=False)
    with pytest.raises(CheckpointError) as raised:
        out.sum().backward()
    message = str(raised.value)
    # torch's information, then the hint.
    assert "A different number of tensors was saved during the original forward and recomputation" in message
    assert "Number of tensors saved during forward: 3" in message
    assert "Number of tensors saved during recomputation: 2" in message
    assert "a KV cache (config.use_cache) or other state that changes between the forward and the recompute" in message


def test_a_cache_left_on_in_a_nested_config_fails_with_the_hint():
    """What the hint is for: T5's decoder config with use_cache on under a recomputing mode."""
    if not c_checkpoint_available():
        pytest.skip("torch's checkpoint runs where the C hooks are not built: torch's message")
    model, batch = BUILD["T5"]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = torch_offload.apply(model, "hidden_states")
    model.decoder.config.use_cache = True
    with pytest.raises(CheckpointError, match=r"(?s)different number of tensors.*KV cache \(config\.use_cache\)"):
        loss(model, batch).backward()
    model.decoder.config.use_cache = False
    handle.remove()
