"""Under apply(mode="selective") a named policy's torch function mode is entered only while a block's
attention modules run (and, with MLP projection groups, its MLP modules), once a forward run has shown
that the block's intercepted calls are made there (policies/interception.py, BlockScoping); a block
whose attention module the presets do not find, or that makes an intercepted call elsewhere, keeps
the mode for its whole run. Either way the same tensors are offloaded and the gradients are those of
plain training."""
import copy
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import _get_current_function_mode_stack

import torch_offload
from python_tests.support.llama import _steps_match_plain, _tiny_llama
from python_tests.support.selective import AttentionBlock
from torch_offload.policies import interception

WIDTH, HEADS = 32, 4


@pytest.fixture
def seen(monkeypatch):
    """The functions that pass through the mode of any block, in call order."""
    calls = []
    original = interception._BlockCalls.__torch_function__

    def recording(self, func, types, args=(), kwargs=None):
        calls.append(func)
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(interception._BlockCalls, "__torch_function__", recording)
    return calls


def _scopings(handle):
    return [wrapper.scoping for wrapper in handle._wrappers]


def _saves_of_a_step(model, handle, ids):
    before = handle.stats()["saves"]
    model(input_ids=ids, labels=ids).loss.backward()
    return handle.stats()["saves"] - before


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("policy", ["attention", "attention+qkv+out_proj", "attention+fc2+keep_fc1"])
def test_llama_calls_outside_attention_skip_the_mode_with_the_same_gradients_and_saves(policy, use_reentrant, seen):
    model, plain, whole = _tiny_llama("cpu", 0.0), _tiny_llama("cpu", 0.0), _tiny_llama("cpu", 0.0)
    handle = torch_offload.apply(model, "selective", policy=policy, min_bytes=0, use_reentrant=use_reentrant)
    whole_handle = torch_offload.apply(whole, "selective", policy=policy, min_bytes=0, use_reentrant=use_reentrant)
    for wrapper in whole_handle._wrappers:
        wrapper.scoping = None  # the mode for each whole run
    assert all(s is not None and s.state == "unchecked" for s in _scopings(handle))
    _steps_match_plain(model, plain, "cpu", steps=3)
    assert all(s.state == "scoped" for s in _scopings(handle))

    ids = torch.randint(0, 256, (2, 32))
    whole_saves = _saves_of_a_step(whole, whole_handle, ids)
    seen.clear()
    assert _saves_of_a_step(model, handle, ids) == whole_saves
    names = {getattr(func, "__name__", None) for func in seen}
    assert "scaled_dot_product_attention" in names
    # The decoder layer's norms, and the MLP's activation where no MLP group is in the policy, ran
    # outside the mode.
    assert "rsqrt" not in names
    assert ("silu" in names) == ("fc" in policy)
    handle.remove()
    whole_handle.remove()


class _Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, WIDTH))


class _UnnamedAttentionBlock(nn.Module):
    """Its attention module has a name the presets do not know."""

    def __init__(self):
        super().__init__()
        self.norm, self.mixer = nn.LayerNorm(WIDTH), _Mixer()

    def forward(self, x):
        return x + self.mixer(self.norm(x))


class _AttentionOutsideBlock(_UnnamedAttentionBlock):
    """Has a module the presets take for its attention (self_attn), but calls SDPA outside it too."""

    def __init__(self):
        super().__init__()
        self.self_attn = _Mixer()

    def forward(self, x):
        return x + self.mixer(self.norm(x)) + self.self_attn(x)


def _train(blocks, x):
    blocks.zero_grad(set_to_none=True)
    x.grad = None
    h = x
    for block in blocks:
        h = block(h)
    h.square().sum().backward()
    return [x.grad] + [p.grad for p in blocks.parameters()]


@pytest.mark.parametrize("make, state", [(_UnnamedAttentionBlock, None), (AttentionBlock, None),
                                         (_AttentionOutsideBlock, "whole")])
def test_a_block_whose_calls_are_not_all_inside_an_attention_module_keeps_the_mode_for_its_whole_run(
        make, state, seen):
    torch.manual_seed(0)
    blocks = nn.ModuleList(make() for _ in range(2))
    plain = copy.deepcopy(blocks)
    x = torch.randn(2, 16, WIDTH, requires_grad=True)
    calls_per_block = 2 if make is _AttentionOutsideBlock else 1
    handle = torch_offload.apply(blocks, "selective", list(blocks), min_bytes=0)
    for _ in range(2):
        before = handle.stats()["saves"]
        got = _train(blocks, x)
        # Each block's input, and each attention call's output and logsumexp.
        assert handle.stats()["saves"] - before == 2 * (1 + 2 * calls_per_block)
        assert all(torch.equal(a, b) for a, b in zip(got, _train(plain, x)))
    assert [s if s is None else s.state for s in _scopings(handle)] == [state, state]
    # The block's norm passed through the mode: the whole run entered it.
    assert "layer_norm" in {getattr(func, "__name__", None) for func in seen}
    handle.remove()


def _hooks(module):
    return len(module._forward_pre_hooks) + len(module._forward_hooks)


def test_remove_takes_the_hooks_off_and_a_deep_copy_has_its_own():
    model = _tiny_llama("cpu", 0.0)
    attention = [layer.self_attn for layer in model.model.layers]
    handle = torch_offload.apply(model, "selective", policy="attention+fc2", min_bytes=0)
    mlps = [layer.mlp for layer in model.model.layers]
    assert all(_hooks(m) == 2 for m in attention + mlps)
    twin, twin_handle = copy.deepcopy((model, handle))
    plain = _tiny_llama("cpu", 0.0)
    _steps_match_plain(twin, plain, "cpu", steps=2)
    assert all(s.state == "scoped" for s in _scopings(twin_handle))
    assert all(s.state == "unchecked" for s in _scopings(handle))  # the original's blocks have not run
    handle.remove()
    assert all(_hooks(m) == 0 for m in attention + mlps)
    assert all(_hooks(layer.self_attn) == 2 for layer in twin.model.layers)
    twin_handle.remove()
    assert all(_hooks(layer.self_attn) == 0 for layer in twin.model.layers)


class _Failing(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention, self.fail = attention, False

    def forward(self, *args, **kwargs):
        out = self.attention(*args, **kwargs)
        if self.fail:
            raise RuntimeError("failed inside the attention module")
        return out


def test_an_error_inside_the_attention_module_leaves_no_mode_entered():
    model = _tiny_llama("cpu", 0.0)
    layer = model.model.layers[0]
    layer.self_attn = _Failing(layer.self_attn)
    handle = torch_offload.apply(model, "selective", min_bytes=0)
    ids = torch.randint(0, 256, (1, 16))
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
    assert _scopings(handle)[0].state == "scoped"
    layer.self_attn.fail = True
    with pytest.raises(RuntimeError, match="failed inside the attention module"):
        model(input_ids=ids, labels=ids)
    assert not _get_current_function_mode_stack()
    layer.self_attn.fail = False
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    handle.remove()


def test_another_thread_calling_the_attention_module_during_a_scoped_run_sees_no_mode():
    model = _tiny_llama("cpu", 0.0)
    handle = torch_offload.apply(model, "selective", min_bytes=0)
    ids = torch.randint(0, 256, (1, 16))
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
    attention = model.model.layers[0].self_attn
    barrier, seen, errors = threading.Barrier(2, timeout=60), [], []
    original = attention.forward

    def pausing(*args, **kwargs):  # the main thread's run waits here, inside the mode
        if threading.current_thread() is threading.main_thread():
            seen.append(len(_get_current_function_mode_stack()))
            barrier.wait()
            barrier.wait()
        return original(*args, **kwargs)

    def other():
        try:
            barrier.wait()
            hidden = torch.randn(1, 16, 64)
            cos, sin = model.model.rotary_emb(hidden, torch.arange(16)[None])
            saves = handle.stats()["saves"]
            with torch.no_grad():
                attention(hidden, (cos, sin), None)  # runs its forward hooks in this thread
            seen.append(("other", len(_get_current_function_mode_stack()), handle.stats()["saves"] - saves))
            barrier.wait()
        except BaseException as error:
            errors.append(error)
            barrier.abort()

    attention.forward = pausing
    thread = threading.Thread(target=other)
    thread.start()
    try:
        model(input_ids=ids, labels=ids)  # the forward only: the other thread calls once
    finally:
        thread.join(60)
        del attention.forward
    assert not errors, errors
    assert seen == [1, ("other", 0, 0)]  # the main thread's mode, entered by the hook; none in the other
    handle.remove()


def test_the_transformers_route_scopes_each_layer_and_remove_takes_the_hooks_off(seen):
    from torch_offload.integrations import gradient_checkpointing_enable

    model, plain = _tiny_llama("cpu", 0.0), _tiny_llama("cpu", 0.0)
    handle = gradient_checkpointing_enable(model, "selective", policy="attention+qkv", min_bytes=0)
    _steps_match_plain(model, plain, "cpu", steps=3)
    functions = {layer._gradient_checkpointing_func.keywords["scoping"] for layer in model.model.layers}
    assert {scoping.state for scoping in functions} == {"scoped"} and len(functions) == 3
    seen.clear()
    ids = torch.randint(0, 256, (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    names = {getattr(func, "__name__", None) for func in seen}
    assert "scaled_dot_product_attention" in names and "rsqrt" not in names
    handle.remove()
    assert all(_hooks(layer.self_attn) == 0 for layer in model.model.layers)
