"""The chunked loss is a causal LM's loss: chunk_lm_loss refuses a model whose own loss is another
(a masked LM's, an encoder-decoder's), naming the model and why, and long_context=True leaves the
chunked loss off for such a model with that reason in handle.explain()."""
import warnings

import pytest

import torch_offload
from python_tests.support.model_zoo import ARCHITECTURES

BUILD = {arch.name: arch.build for arch in ARCHITECTURES}


@pytest.mark.parametrize("name, why", [
    ("BERT", r"BertForMaskedLM is not a causal LM: its loss is transformers' ForMaskedLM loss"),
    ("T5", r"T5ForConditionalGeneration is not a causal LM: an encoder-decoder model "
           r"\(config.is_encoder_decoder=True\)"),
])
def test_a_model_that_is_not_a_causal_lm_is_refused(name, why):
    model, _ = BUILD[name]()
    with pytest.raises(TypeError, match=r"torch_offload\.chunk_lm_loss: " + why):
        torch_offload.chunk_lm_loss(model)
    assert "forward" not in model.__dict__ and "_loss_function" not in model.__dict__, "the model is unchanged"
    with pytest.raises(TypeError, match=why):
        torch_offload.apply(model, chunked_loss=True)
    assert "forward" not in model.__dict__


@pytest.mark.parametrize("name", ["GPT-2", "Qwen2.5-VL", "Llama"])
def test_causal_lms_are_taken(name):
    # GPT2LMHeadModel's class name matches no loss type: transformers gives it the causal LM loss;
    # a vision-language ...ForConditionalGeneration computes the causal LM loss too.
    model, _ = BUILD[name]()
    torch_offload.chunk_lm_loss(model).remove()


def test_peft_wrapped_causal_lm_is_taken():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(BUILD["Llama"]()[0], peft.LoraConfig(r=4, target_modules="all-linear"))
    torch_offload.chunk_lm_loss(model).remove()


@pytest.mark.parametrize("name", ["BERT", "T5"])
def test_long_context_leaves_the_chunked_loss_off_with_the_reason(name):
    model, _ = BUILD[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = torch_offload.apply(model, long_context=True)
    try:
        assert handle.chunked_loss is None
        rows = [line for line in handle.explain().splitlines() if line.startswith("| chunked loss |")]
        assert len(rows) == 1 and "| off |" in rows[0] and "is not a causal LM" in rows[0], handle.explain()
    finally:
        handle.remove()
