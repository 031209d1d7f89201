"""torch_offload.sdpa_is_causal: a compiled Hugging Face model called without an attention_mask gets
SDPA's is_causal instead of the dense causal mask transformers builds while tracing; every other call
(an attention_mask, a sliding window) keeps the mask; results equal transformers' own."""
import copy

import pytest
import torch
import torch._dynamo

import torch_offload
from python_tests.support.llama import _tiny_llama


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    with torch.compiler.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()


def _sdpa_calls(gm):
    """(has a mask, is_causal) for each SDPA call in a dynamo graph."""
    calls = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch._C._nn.scaled_dot_product_attention:
            mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
            calls.append((mask is not None, bool(node.kwargs.get("is_causal", False))))
    return calls


def _compiled(model, graphs, **compile_kwargs):
    """model compiled with a backend that records each dynamo graph in `graphs` and runs it as is."""
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return torch.compile(model, backend=backend, fullgraph=True, **compile_kwargs)


def _llama_and_ours():
    """The tiny Llama without dropout, and a copy switched by sdpa_is_causal."""
    torch.manual_seed(0)
    model = _tiny_llama("cpu", dropout=0.0)
    ours = copy.deepcopy(model)
    assert torch_offload.sdpa_is_causal(ours) == "sdpa"
    return model, ours


def _loss_and_grads(model, **inputs):
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]


def _assert_same_training(ours, theirs):
    """(loss, grads) of two steps agree within fp32 rounding."""
    (loss_o, grads_o), (loss_t, grads_t) = ours, theirs
    torch.testing.assert_close(loss_o, loss_t, rtol=1e-6, atol=1e-6)
    assert len(grads_o) == len(grads_t) > 0
    for a, b in zip(grads_o, grads_t):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_compiled_call_without_a_mask_uses_is_causal_and_matches_transformers():
    model, ours = _llama_and_ours()
    ids = torch.randint(0, 256, (2, 32))
    theirs_graphs, our_graphs = [], []
    theirs = _loss_and_grads(_compiled(model, theirs_graphs), input_ids=ids, labels=ids)
    mine = _loss_and_grads(_compiled(ours, our_graphs), input_ids=ids, labels=ids)
    # transformers, compiled: the dense mask; ours: no mask, the kernel's causal masking
    assert _sdpa_calls(theirs_graphs[0]) and all(call == (True, False) for call in _sdpa_calls(theirs_graphs[0]))
    assert _sdpa_calls(our_graphs[0]) and all(call == (False, True) for call in _sdpa_calls(our_graphs[0]))
    _assert_same_training(mine, theirs)


def test_a_call_with_an_attention_mask_still_gets_the_mask():
    model, ours = _llama_and_ours()
    ids = torch.randint(0, 256, (2, 32))
    padding = torch.ones(2, 32, dtype=torch.long)
    padding[0, :5] = 0
    graphs = []
    mine = _loss_and_grads(_compiled(ours, graphs), input_ids=ids, attention_mask=padding, labels=ids)
    theirs = _loss_and_grads(model, input_ids=ids, attention_mask=padding, labels=ids)
    assert all(has_mask for has_mask, _ in _sdpa_calls(graphs[-1]))
    _assert_same_training(mine, theirs)


def test_packed_sequences_given_as_position_ids_keep_their_mask():
    model, ours = _llama_and_ours()
    ids = torch.randint(0, 256, (1, 32))
    positions = torch.cat([torch.arange(20), torch.arange(12)]).unsqueeze(0)  # two sequences packed
    graphs = []
    compiled = _compiled(ours, graphs)
    mine = _loss_and_grads(compiled, input_ids=ids, position_ids=positions, labels=ids)
    theirs = _loss_and_grads(model, input_ids=ids, position_ids=positions, labels=ids)
    assert all(has_mask for has_mask, _ in _sdpa_calls(graphs[-1]))
    _assert_same_training(mine, theirs)
    # the same compiled model, called plainly afterwards, recompiles without the mask
    _loss_and_grads(compiled, input_ids=ids, labels=ids)
    assert all(call == (False, True) for call in _sdpa_calls(graphs[-1]))


def test_a_sliding_window_keeps_its_mask():
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                           sliding_window=8, attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    model = MistralForCausalLM(config).train()
    ours = copy.deepcopy(model)
    torch_offload.sdpa_is_causal(ours)
    ids = torch.randint(0, 256, (1, 32))
    graphs = []
    loss_o, _ = _loss_and_grads(_compiled(ours, graphs), input_ids=ids, labels=ids)
    loss_t, _ = _loss_and_grads(model, input_ids=ids, labels=ids)
    assert all(has_mask for has_mask, _ in _sdpa_calls(graphs[0]))
    torch.testing.assert_close(loss_o, loss_t, rtol=1e-6, atol=1e-6)


def test_compile_option_and_refusals():
    model = _tiny_llama("cpu")
    compiled = torch_offload.compile(model, "hidden_states", backend="aot_eager", sdpa_is_causal=True)
    assert model.config._attn_implementation == "torch_offload_sdpa"
    ids = torch.randint(0, 256, (2, 32))
    compiled(input_ids=ids, labels=ids).loss.backward()
    assert torch_offload.sdpa_is_causal(model) == "torch_offload_sdpa"  # a second call changes nothing
    with pytest.raises(ValueError, match="Sequential has None"):
        torch_offload.sdpa_is_causal(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    eager = _tiny_llama("cpu")
    eager.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="LlamaForCausalLM has 'eager'"):
        torch_offload.sdpa_is_causal(eager)


def test_one_dynamic_compile_serves_several_lengths_without_the_mask():
    model, ours = _llama_and_ours()
    graphs = []
    compiled = _compiled(ours, graphs, dynamic=True)
    for length in (24, 40):
        ids = torch.randint(0, 256, (1, length))
        _assert_same_training(_loss_and_grads(compiled, input_ids=ids, labels=ids),
                              _loss_and_grads(model, input_ids=ids, labels=ids))
    assert len(graphs) == 1, "one dynamic compile for both lengths"
    assert all(call == (False, True) for call in _sdpa_calls(graphs[0]))


def test_a_peft_model_drops_the_mask_too():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(_tiny_llama("cpu", dropout=0.0), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    reference = copy.deepcopy(model)
    assert torch_offload.sdpa_is_causal(model) == "sdpa"
    graphs = []
    ids = torch.randint(0, 256, (1, 32))
    mine = _loss_and_grads(_compiled(model, graphs), input_ids=ids, labels=ids)
    theirs = _loss_and_grads(reference, input_ids=ids, labels=ids)
    assert all(call == (False, True) for call in _sdpa_calls(graphs[0]))
    _assert_same_training(mine, theirs)


def _ours_in_registries() -> list:
    """Where transformers' registries still hold our implementation."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = torch_offload.compiler.hf_causal_mask.IMPLEMENTATION
    places = {"AttentionInterface": AttentionInterface._global_mapping,
              "AttentionMaskInterface": AttentionMaskInterface._global_mapping,
              "ALL_ATTENTION_FUNCTIONS": dict(ALL_ATTENTION_FUNCTIONS),
              "ALL_MASK_ATTENTION_FUNCTIONS": dict(ALL_MASK_ATTENTION_FUNCTIONS)}
    return [where for where, mapping in places.items() if name in mapping]


@pytest.fixture
def no_switched_model():
    """Models switched by earlier tests freed (compiled ones sit in reference cycles until collected)."""
    import gc

    torch._dynamo.reset()
    gc.collect()
    assert _ours_in_registries() == []


def test_remove_takes_ours_out_of_transformers_registries_once_no_model_uses_it(no_switched_model):
    first, second = _tiny_llama("cpu", dropout=0.0), _tiny_llama("cpu", dropout=0.0)
    hooks = (dict(first._forward_pre_hooks), dict(first._forward_hooks))
    previous = torch_offload.sdpa_is_causal(first)
    assert previous == "sdpa" and isinstance(previous, str)
    compiled = torch_offload.compile(second, "hidden_states", backend="aot_eager", sdpa_is_causal=True)
    assert len(_ours_in_registries()) == 4
    previous.remove()
    assert first.config._attn_implementation == "sdpa"
    assert (dict(first._forward_pre_hooks), dict(first._forward_hooks)) == hooks
    assert len(_ours_in_registries()) == 4, "the second model still uses it"
    ids = torch.randint(0, 256, (1, 16))
    compiled(input_ids=ids, labels=ids).loss.backward()
    compiled.offload_changes.remove()
    assert _ours_in_registries() == []
    assert second.config._attn_implementation == "sdpa"
    previous.remove()  # a second remove() changes nothing
    assert _ours_in_registries() == []
    first(input_ids=ids, labels=ids).loss.backward()  # both train as transformers' own again
    second(input_ids=ids, labels=ids).loss.backward()


def test_a_model_already_switched_is_not_undone_by_a_second_answer(no_switched_model):
    model = _tiny_llama("cpu", dropout=0.0)
    previous = torch_offload.sdpa_is_causal(model)
    again = torch_offload.sdpa_is_causal(model)
    assert again == "torch_offload_sdpa"
    again.remove()
    assert model.config._attn_implementation == "torch_offload_sdpa" and len(_ours_in_registries()) == 4
    previous.remove()
    assert model.config._attn_implementation == "sdpa" and _ours_in_registries() == []


def test_each_switched_model_notes_its_own_calls(no_switched_model):
    from torch_offload.compiler import hf_causal_mask

    first, second = _tiny_llama("cpu", dropout=0.0), _tiny_llama("cpu", dropout=0.0)
    answers = [torch_offload.sdpa_is_causal(first), torch_offload.sdpa_is_causal(second)]
    seen = []
    first.model.register_forward_pre_hook(lambda module, args: seen.append(
        (hf_causal_mask._switches[id(first.config)].plain, hf_causal_mask._switches[id(second.config)].plain)))
    ids = torch.randint(0, 256, (1, 16))
    first(input_ids=ids)
    assert seen == [(True, False)]  # during the first model's plain call, the second's note is untouched
    assert not hf_causal_mask._switches[id(first.config)].plain  # cleared after the call
    for answer in answers:
        answer.remove()
    assert hf_causal_mask._switches == {} and _ours_in_registries() == []


def test_a_deep_copy_keeps_working_after_the_original_is_removed(no_switched_model):
    import gc

    model = _tiny_llama("cpu", dropout=0.0)
    previous = torch_offload.sdpa_is_causal(model)
    twin = copy.deepcopy(model)  # an EMA or teacher copy
    previous.remove()
    assert twin.config._attn_implementation == "torch_offload_sdpa" and len(_ours_in_registries()) == 4
    ids = torch.randint(0, 256, (1, 16))
    graphs = []
    _compiled(twin, graphs)(input_ids=ids, labels=ids).loss.backward()
    assert all(call == (False, True) for call in _sdpa_calls(graphs[0]))  # the copy's own note
    del twin, graphs
    torch._dynamo.reset()
    gc.collect()
    assert _ours_in_registries() == []
