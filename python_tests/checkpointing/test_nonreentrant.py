"""Our non-reentrant checkpoint with its hooks in C (torch_offload/nonreentrant.py,
pyext/checkpoint_frame.cpp): which calls it serves, that it holds no recomputed tensor longer than
backward needs it and no frame after the graph is gone, one recompute per backward (graph task or
GraphExecGroup), unpacks outside backward, nesting with torch's checkpoint, and gradients equal to
torch's. torch's own checkpoint tests run through it in test_checkpoint_torch_suite*.py."""
import gc
import weakref

import pytest
import torch
from torch.utils import checkpoint as torch_checkpoint_module
from torch.utils.checkpoint import GraphExecGroup

import torch_offload
from torch_offload.checkpointing import nonreentrant
from torch_offload._library.loading import load_save_hooks
from python_tests.support.devices import DEVICES

pytestmark = pytest.mark.skipif(not nonreentrant.available(), reason="the C save hooks are not built")


def _ours(fn, *args, **kwargs):
    return torch_offload.checkpoint(fn, *args, use_reentrant=False, **kwargs)


def _live_frames() -> int:
    gc.collect()
    frame_type = load_save_hooks().CheckpointFrame
    return sum(1 for obj in gc.get_objects() if type(obj) is frame_type)


def test_the_c_hooks_serve_default_calls_and_torch_serves_debug(monkeypatch):
    torch_calls = []
    original = torch_checkpoint_module._checkpoint_without_reentrant_generator

    def counting(*args, **kwargs):
        torch_calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch_checkpoint_module, "_checkpoint_without_reentrant_generator", counting)
    x = torch.randn(4, requires_grad=True)
    _ours(lambda t: t.sin().exp(), x).sum().backward()
    assert torch_calls == []
    _ours(lambda t: t.sin().exp(), x, debug=True).sum().backward()
    assert torch_calls == [1]


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_equal_torch_checkpoint_with_dropout(device):
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.3), torch.nn.GELU(),
                                torch.nn.Linear(32, 16)).to(device)
    x = torch.randn(8, 16, device=device, requires_grad=True)

    def grads(checkpoint):
        block.zero_grad()
        x.grad = None
        torch.manual_seed(1)
        out = checkpoint(block, x, use_reentrant=False)
        out.square().sum().backward()
        return [out.detach(), x.grad] + [p.grad for p in block.parameters()]

    ours, theirs = grads(torch_offload.checkpoint), grads(torch_checkpoint_module.checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_a_recomputed_tensor_is_not_held_after_backward_used_it():
    seen = []

    class Saves(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x * 3)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            (saved,) = ctx.saved_tensors
            seen.append(weakref.ref(saved))
            return g * saved

    x = torch.randn(1000, requires_grad=True)
    _ours(lambda t: Saves.apply(t + 1), x).sum().backward()
    assert len(seen) == 1
    gc.collect()
    assert seen[0]() is None  # neither the frame nor anything of ours kept it


def test_no_frame_outlives_its_graph():
    before = _live_frames()
    x = torch.randn(8, requires_grad=True)
    outs = [_ours(lambda t: t.sin() * t.cos(), x) for _ in range(5)]
    assert _live_frames() == before + 5
    outs[0].sum().backward()
    del outs
    assert _live_frames() == before
    out = _ours(lambda t: t.sin() * t.cos(), x)  # a graph dropped without backward
    del out
    assert _live_frames() == before


def test_one_recompute_per_backward_and_one_under_a_graph_exec_group():
    runs = []

    def fn(a, b):
        runs.append(1)
        return a.sin(), b.cos()

    a, b = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    out_a, out_b = _ours(fn, a, b)
    torch.autograd.grad(out_a.sum(), a, retain_graph=True)
    torch.autograd.grad(out_b.sum(), b, retain_graph=True)
    assert len(runs) == 3  # the forward, then one recompute for each of the two backwards
    runs.clear()
    out_a, out_b = _ours(fn, a, b)
    with GraphExecGroup():
        (grad_a,) = torch.autograd.grad(out_a.sum(), a, retain_graph=True)
        (grad_b,) = torch.autograd.grad(out_b.sum(), b)
    assert len(runs) == 2  # the forward, one recompute shared by both
    assert torch.equal(grad_a, a.detach().cos()) and torch.equal(grad_b, -b.detach().sin())


def test_an_unpack_outside_backward_recomputes_for_itself():
    x = torch.randn(5, requires_grad=True)
    out = _ours(lambda t: (t * 2).sin(), x)
    assert torch.equal(out.grad_fn._saved_self, x.detach() * 2)
    assert torch.equal(out.grad_fn._saved_self, x.detach() * 2)  # again: a fresh recompute
    out.sum().backward()
    assert torch.equal(x.grad, 2 * (x.detach() * 2).cos())


@pytest.mark.parametrize("inner, outer", [("ours", "ours"), ("torch", "ours"), ("ours", "torch")])
def test_nested_checkpoints_give_plain_gradients(inner, outer):
    pick = {"ours": _ours, "torch": lambda f, *a: torch_checkpoint_module.checkpoint(f, *a, use_reentrant=False)}
    x = torch.randn(6, requires_grad=True)

    def inner_fn(t):
        return t.sin() * t.exp()

    def outer_fn(t):
        return pick[inner](inner_fn, t.cos()).tanh() * t

    expected = torch.autograd.grad(outer_fn(x).sum(), x)[0]
    got = torch.autograd.grad(pick[outer](outer_fn, x).sum(), x)[0]
    assert torch.equal(got, expected)


def test_an_error_in_the_recompute_reaches_the_caller_and_backward_can_retry():
    fail = []

    def fn(t):
        if fail:
            raise ValueError("recompute failed")
        return t.sin().exp()

    x = torch.randn(3, requires_grad=True)
    out = _ours(fn, x)
    fail.append(1)
    with pytest.raises(ValueError, match="recompute failed"):
        out.sum().backward(retain_graph=True)
    fail.clear()
    out.sum().backward()
    assert torch.allclose(x.grad, x.detach().cos() * x.detach().sin().exp())


def test_an_unknown_determinism_check_names_itself():
    with pytest.raises(ValueError, match="determinism_check should be one of .* but got strict"):
        _ours(lambda t: t.sin(), torch.randn(2, requires_grad=True), determinism_check="strict")
