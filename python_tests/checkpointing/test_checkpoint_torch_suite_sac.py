"""PyTorch's nested-checkpoint tests (test/test_autograd.py) and TestSelectiveActivationCheckpoint,
rewritten for torch_offload.checkpoint (read, not copied): each asserts what torch's test asserts,
values and gradients equal to torch's checkpoint (bit for bit in fp32), or torch's error. The rest of
torch's checkpoint tests are in test_checkpoint_torch_suite.py."""
import functools
import weakref

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from python_tests.support.torch_checkpoint_pair import _assert_matches_torch, ours, theirs


# --- nested checkpoints ---------------------------------------------------------------------------

@pytest.mark.parametrize("nesting", ["inside", "around"])
def test_nested_checkpoints_match_torch(nesting):
    def make(checkpoint):
        def inner(x):
            return x.sin().exp()

        def outer(x):
            return checkpoint(inner, x).cos() * x if nesting == "inside" else inner(x) * 2

        return (lambda x: checkpoint(outer, x)) if nesting == "inside" else (
            lambda x: checkpoint(outer, checkpoint(inner, x)))

    grads = []
    for checkpoint in (ours, theirs):
        torch.manual_seed(0)
        x = torch.randn(5, dtype=torch.float64, requires_grad=True)
        make(checkpoint)(x).sum().backward()
        grads.append(x.grad)
    assert torch.equal(*grads)


def test_nested_checkpoint_double_backward():
    def f(x):
        return ours(lambda t: ours(lambda u: u.sin().exp(), t).sin(), x)

    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    (g_ref,) = torch.autograd.grad(x.sin().exp().sin().sum(), x, create_graph=True)
    (gg_ref,) = torch.autograd.grad(g_ref.sum(), x)
    assert torch.allclose(g, g_ref) and torch.allclose(gg, gg_ref)


# --- TestSelectiveActivationCheckpoint -------------------------------------------------------------

def _sac(policy, **kwargs):
    return functools.partial(create_selective_checkpoint_contexts, policy, **kwargs)


def _mm_fn(x, y):
    return torch.sigmoid(torch.matmul(torch.matmul(x, y), y)) * y


def _xy():
    return [torch.randn(10, 10, requires_grad=True), torch.randn(10, 10, requires_grad=True)]


def test_sac_saved_ops_are_not_recomputed():
    recomputed = {"ours": [], "theirs": []}

    def policy_for(name):
        def policy(ctx, op, *args, **kwargs):
            if ctx.is_recompute:
                recomputed[name].append(op)
            return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE
        return policy

    for name, checkpoint in (("ours", ours), ("theirs", theirs)):
        torch.manual_seed(0)
        x, y = _xy()
        checkpoint(_mm_fn, x, y, context_fn=_sac(policy_for(name))).sum().backward()
    assert recomputed["ours"] == recomputed["theirs"]
    assert torch.ops.aten.mm.default in recomputed["ours"]  # asked, then served from storage
    _assert_matches_torch(_mm_fn, _xy, context_fn=_sac([torch.ops.aten.mm.default]))


def test_sac_output_already_has_autograd_meta():
    def fn(x, y):
        return x.view(-1), y.sin().cos()

    grads = []
    for checkpoint in (ours, theirs):
        torch.manual_seed(0)
        x, y = torch.tensor([1.0], requires_grad=True), torch.randn(1, requires_grad=True)
        a, b = checkpoint(fn, x, y, context_fn=_sac([torch.ops.aten.view.default]))
        (a.sum() + b.sum()).backward()
        grads.append((x.grad, y.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_sac_bad_op_list():
    with pytest.raises(ValueError, match="Expected op in `op_list` to be an OpOverload"):
        ours(_mm_fn, *_xy(), context_fn=_sac([torch.ops.aten.mm]))


def test_sac_policy_with_state():
    def policy_fn_factory():
        counters = {"forward": 0, "recompute": 0}

        def policy(ctx, op, *args, **kwargs):
            key = "recompute" if ctx.is_recompute else "forward"
            if op == torch.ops.aten.sin.default:
                counters[key] += 1
                return CheckpointPolicy.MUST_SAVE if counters[key] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.PREFER_RECOMPUTE
        return policy

    def fn(x):
        return x.sin().sin().sin().sum()

    for checkpoint in (ours, theirs):
        x = torch.randn(3, requires_grad=True)
        checkpoint(fn, x, context_fn=functools.partial(create_selective_checkpoint_contexts,
                                                       policy_fn_factory())).backward()
        ref = x.detach().clone().requires_grad_()
        ref.sin().sin().sin().sum().backward()
        assert torch.equal(x.grad, ref.grad)


def test_sac_storage_freed_after_backward():
    refs = []

    def fn(x):
        y = x.sin()
        refs.append(weakref.ref(y))
        return y.exp()

    x = torch.randn(100, requires_grad=True)
    out = ours(fn, x, context_fn=_sac([torch.ops.aten.sin.default]))
    out.sum().backward()
    del out
    assert all(r() is None for r in refs)


def test_sac_cached_tensor_mutated_is_an_error():
    def fn(x):
        y = x.sin()
        out = y.exp()
        y.mul_(2)
        return out * 1

    with pytest.raises(RuntimeError, match="has been mutated"):
        ours(fn, torch.randn(3, requires_grad=True), context_fn=_sac([torch.ops.aten.sin.default])).sum().backward()
    # allow_cache_entry_mutation=True turns the check off (torch's meaning)
    ours(fn, torch.randn(3, requires_grad=True),
         context_fn=_sac([torch.ops.aten.sin.default], allow_cache_entry_mutation=True)).sum().backward()


@pytest.mark.parametrize("reduce, op", [
    (lambda y: torch.var_mean(y, dim=0), torch.ops.aten.var_mean.correction),  # two outputs
    (lambda y: torch.max(y, dim=1), torch.ops.aten.max.dim),  # one of them not differentiable
], ids=["more_than_one_output", "non_differentiable_output"])
def test_sac_op_with_several_outputs(reduce, op):
    def fn(x):
        first, second = reduce(x.sin())
        return first.exp() * second

    _assert_matches_torch(fn, lambda: [torch.randn(5, 4, requires_grad=True)], context_fn=_sac([op]))


def test_sac_backward_twice_is_an_error():
    x = torch.randn(3, requires_grad=True)
    out = ours(lambda t: t.sin().exp(), x, context_fn=_sac([torch.ops.aten.sin.default]))
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="Trying to backward an extra time"):
        out.sum().backward()


def test_sac_with_dropout_matches_torch():
    drop = nn.Dropout(0.3)

    def fn(x):
        return drop(torch.mm(x, x)).tanh()

    _assert_matches_torch(fn, lambda: [torch.randn(8, 8, requires_grad=True)],
                          context_fn=_sac([torch.ops.aten.mm.default]))
