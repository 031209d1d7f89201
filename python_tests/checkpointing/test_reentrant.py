"""The reentrant variant (use_reentrant=True): the same gradients as torch's checkpoints, bit for bit
in fp32, through checkpoint(), selective_checkpoint() and apply()'s modes; the input offloaded and
not kept on the device; torch's reentrant limits as clear errors, not wrong gradients.

Cases brought over from torch's reentrant checkpoint tests (test/test_utils.py TestCheckpoint:
RNG replay, non-tensor inputs and outputs, inputs without grad, the .grad() error; read, not copied)
plus what our variant adds (keyword arguments and frozen inputs that still train parameters are
tested with both variants in test_checkpoint.py).
"""
import copy
import functools
import weakref

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import torch_offload
from python_tests.support.checkpoint_blocks import Block, _pair, _run
from python_tests.support.devices import DEVICES, cuda_only
from python_tests.support.grads import assert_same_grads
from python_tests.support.llama import _steps_match_plain, _tiny_llama

ours = functools.partial(torch_offload.checkpoint, use_reentrant=True)


def _torch_reentrant(block, h, **kwargs):
    return torch_checkpoint(functools.partial(block, **kwargs), h, use_reentrant=True)


def _torch_non_reentrant(block, h, **kwargs):
    return torch_checkpoint(block, h, use_reentrant=False, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reference", [_torch_reentrant, _torch_non_reentrant])
def test_matches_torchs_checkpoints_with_dropout(device, reference):
    a, b, x = _pair(device)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    assert torch.equal(_run(a, xa, ours), _run(b, xb, reference))
    assert_same_grads(a, b)
    assert torch.equal(xa.grad, xb.grad)


def test_nested_and_non_tensor_outputs():
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    lin_b = copy.deepcopy(lin)

    def fn(layer, x):
        y = layer(x)
        return {"y": y, "pair": (y * 2, "tag"), "n": 3, "idx": torch.argmax(y, dim=-1)}

    x = torch.randn(4, 8, requires_grad=True)
    out, ref = ours(fn, lin, x), fn(lin_b, x.detach().clone().requires_grad_())
    assert out["n"] == 3 and out["pair"][1] == "tag" and torch.equal(out["idx"], ref["idx"])
    assert not out["idx"].requires_grad
    (out["y"].sum() + out["pair"][0].sum()).backward()
    (ref["y"].sum() + ref["pair"][0].sum()).backward()
    assert torch.equal(lin.weight.grad, lin_b.weight.grad)


def test_unused_output_gets_no_backward():
    calls = []

    def fn(x):
        calls.append(1)
        return x.sin(), x.cos()

    x = torch.randn(5, requires_grad=True)
    a, _ = ours(fn, x)
    a.sum().backward()
    assert torch.equal(x.grad, torch.cos(x.detach()))
    assert len(calls) == 2  # forward and one recompute


def test_autograd_grad_is_a_clear_error():
    block = Block()
    x = torch.randn(2, 32, requires_grad=True)
    out = ours(block, x)
    with pytest.raises(RuntimeError, match=r"use_reentrant=True.*\.backward\(\) only"):
        torch.autograd.grad(out.sum(), x)


def test_context_fn_and_debug_are_refused_as_in_torch():
    x = torch.randn(2, 32, requires_grad=True)
    with pytest.raises(ValueError, match="context_fn= and debug= are only taken with use_reentrant=False"):
        ours(Block(), x, debug=True)
    with pytest.raises(ValueError, match="context_fn= and debug= are only taken with use_reentrant=False"):
        ours(Block(), x, context_fn=lambda: (None, None))


def test_rng_state_replayed_and_preserve_rng_state_false_runs():
    torch.manual_seed(0)
    x = torch.randn(64, requires_grad=True)
    y = ours(lambda t: torch.nn.functional.dropout(t, 0.5), x)
    y.sum().backward()
    assert torch.equal(x.grad, (y.detach() != 0).float() * 2)  # the same mask as in forward
    ours(lambda t: t * 2, x, preserve_rng_state=False).sum().backward()


def test_autocast_is_replayed_in_the_recompute():
    a, b, x = _pair("cpu", n=2, dropout=0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        la = _run(a, x, ours)
        lb = _run(b, x, _torch_non_reentrant)
    assert torch.equal(la, lb)
    assert_same_grads(a, b)


def test_input_is_offloaded_and_not_kept(manager):
    block = Block()
    x0 = torch.randn(4, 32, requires_grad=True)
    x = x0 * 1  # not a leaf: only the graph could keep it
    ref = weakref.ref(x)
    out = torch_offload.checkpoint(block, x, use_reentrant=True, manager=manager)
    assert manager.stats()["bytes_to_host"] == x.nbytes
    del x
    assert ref() is None
    out.sum().backward()
    assert x0.grad is not None and manager.stats()["restores"] == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,options", [("hidden_states", {}), ("selective", {"policy": "attention"}),
                                          ("selective", {"policy": "attention+qkv+out_proj+fc1+fc2"})])
def test_apply_modes_train_like_torchs_checkpointing(device, mode, options):
    # Dropout in attention: the math SDPA path on CPU, recomputed with the forward's RNG state.
    ours_model = _tiny_llama(device)
    reference = copy.deepcopy(ours_model)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = torch_offload.apply(ours_model, mode, use_reentrant=True, **options)
    _steps_match_plain(ours_model, reference, device)
    assert handle.stats()["saves"] > 0
    handle.remove()


@pytest.mark.parametrize("policy", ["attention", "attention+qkv+out_proj"])
def test_selective_offloads_and_restores_what_the_non_reentrant_path_does(policy):
    # (With "fc2" the non-reentrant path never restores the down projection's product: torch's
    # early stop ends its recompute before it. test_selective counts the products spared.)
    model = _tiny_llama("cpu", 0.0)
    ids = torch.randint(0, 256, (2, 32))
    stats = []
    for use_reentrant in (False, True):
        handle = torch_offload.apply(model, "selective", policy=policy, min_bytes=0, use_reentrant=use_reentrant)
        model(input_ids=ids, labels=ids).loss.backward()
        stats.append({k: handle.stats()[k] for k in ("saves", "restores", "bytes_to_host")})
        handle.remove()
    assert stats[0] == stats[1]


def test_apply_use_reentrant_errors_name_the_case():
    model = _tiny_llama("cpu", 0.0)
    with pytest.raises(TypeError, match=r"apply\(mode='hidden_states'\): use_reentrant='yes'"):
        torch_offload.apply(model, "hidden_states", use_reentrant="yes")
    with pytest.raises(ValueError, match="use_reentrant=True takes the named policies"):
        torch_offload.apply(model, "selective", policy=torch_offload.policies.attention, use_reentrant=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'use_reentrant'"):
        torch_offload.apply(model, "all", use_reentrant=True)


def test_auto_with_use_reentrant_trains_like_checkpointing():
    model, reference = _tiny_llama("cpu", 0.1), _tiny_llama("cpu", 0.1)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = torch_offload.apply(model, "auto", trial_steps=1, use_reentrant=True)
    _steps_match_plain(model, reference, "cpu", steps=6)
    # The reentrant recompute reruns the down projection: the projection policy offloads it too.
    assert handle.auto.planned and [r.candidate for r in handle.auto.results] == [
        "hidden_states", "selective:attention", "selective:attention+qkv+out_proj+fc2", "checkpointing"]
    handle.remove()
    other = torch_offload.apply(model, "auto", trial_steps=1, use_reentrant=True,
                                candidates=["selective:attention+fc2", "checkpointing"])
    _steps_match_plain(model, reference, "cpu", steps=3)
    assert [r.candidate for r in other.auto.results] == ["selective:attention+fc2", "checkpointing"]
    other.remove()


@cuda_only
def test_selective_reentrant_on_cuda_frees_what_the_non_reentrant_path_frees():
    model = _tiny_llama("cuda", 0.0)
    ids = torch.randint(0, 256, (2, 64), device="cuda")
    peaks = []
    for use_reentrant in (False, True):
        handle = torch_offload.apply(model, "selective", use_reentrant=use_reentrant)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        model(input_ids=ids, labels=ids).loss.backward()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated())
        model.zero_grad(set_to_none=False)
        handle.remove()
    assert peaks[1] <= peaks[0] * 1.05
