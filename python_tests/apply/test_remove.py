"""remove() undoes everything apply() changed on a Hugging Face model: its own gradient
checkpointing (on or off, with its checkpoint function) and config.use_cache."""
import warnings

import pytest

import torch_offload
from python_tests.support.llama import _tiny_llama


@pytest.mark.parametrize("mode", ["hidden_states", "all"])
def test_remove_restores_hf_checkpointing_and_cache(mode):
    model = _tiny_llama("cpu")
    model.config.use_cache = True
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layer = model.model.layers[0]
    checkpoint_function = layer._gradient_checkpointing_func
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = torch_offload.apply(model, mode, **({"min_bytes": 0} if mode == "all" else {}))
    assert not model.is_gradient_checkpointing
    assert model.config.use_cache is (mode != "hidden_states")
    handle.remove()
    assert model.is_gradient_checkpointing and model.config.use_cache is True
    assert layer._gradient_checkpointing_func is checkpoint_function
    assert all(m.gradient_checkpointing for m in model.model.layers)


def test_remove_leaves_checkpointing_off_when_it_was_off():
    model = _tiny_llama("cpu")
    torch_offload.apply(model).remove()
    assert not model.is_gradient_checkpointing and model.config.use_cache is False
