"""The named selective policies inside our non-reentrant checkpoint (torch_offload/captured_calls.py): the
attention call runs once, in forward, with no dispatch mode; the recompute stands in for it with the
restored outputs; a call on the math backend, or whose saves other hooks take, is recomputed; the
gradients are those of torch's checkpoint keeping the attention outputs. (The reentrant variant and
torch's checkpoint path keep the dispatch mode, tested in test_selective.py.)"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint as torch_checkpoint
from torch.utils.checkpoint import create_selective_checkpoint_contexts

import torch_offload
from torch_offload.checkpointing import nonreentrant
from torch_offload.policies import interception as attention_offload
from torch_offload.policies import named_policies as policies
from python_tests.support.devices import DEVICES
from python_tests.support.selective import AttentionBlock

pytestmark = pytest.mark.skipif(not nonreentrant.available(), reason="the C save hooks are not built")


# What runs when torch's SDPA runs: a fused kernel, or the math backend's softmax.
_ATTENTION_RUNS = policies.ATTENTION_OPS | {torch.ops.aten._softmax.default, torch.ops.aten._safe_softmax.default}


class _CountingAttention(TorchDispatchMode):
    """Entered around the step, below the block's own modes: counts the runs of torch's SDPA (a call
    that is stood in for, or whose outputs a mode restores, never reaches it)."""

    def __init__(self, counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts["sdpa"] += func in _ATTENTION_RUNS
        return func(*args, **(kwargs or {}))


@pytest.fixture
def counted(monkeypatch):
    """Counts the runs of torch's SDPA and the ops that our dispatch mode sees."""
    counts = {"sdpa": 0, "mode": 0}
    dispatch = attention_offload._FusedOutputs.__torch_dispatch__

    def counting_mode(self, *args, **kwargs):
        counts["mode"] += 1
        return dispatch(self, *args, **kwargs)

    monkeypatch.setattr(attention_offload._FusedOutputs, "__torch_dispatch__", counting_mode)
    with _CountingAttention(counts):
        yield counts


def _run(block, x, use_reentrant=False, policy="attention"):
    out = torch_offload.selective_checkpoint(block, x, policy=policy, use_reentrant=use_reentrant, min_bytes=0)
    out.square().sum().backward()
    return out


def test_the_attention_runs_once_and_without_a_dispatch_mode(counted):
    block = AttentionBlock()
    _run(block, torch.randn(2, 16, 32, requires_grad=True))
    assert counted == {"sdpa": 1, "mode": 0}


def test_the_reentrant_variant_keeps_the_dispatch_mode(counted):
    block = AttentionBlock()
    _run(block, torch.randn(2, 16, 32, requires_grad=True), use_reentrant=True)
    assert counted["sdpa"] == 1 and counted["mode"] > 0  # in the recompute the mode serves the op


def test_the_math_backend_is_recomputed(counted):
    block = AttentionBlock()
    with sdpa_kernel(SDPBackend.MATH):
        _run(block, torch.randn(2, 16, 32, requires_grad=True))
    assert counted == {"sdpa": 2, "mode": 0}


def _attention_save_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy
    return CheckpointPolicy.MUST_SAVE if op in policies.ATTENTION_OPS else CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_gradients_equal_torch_checkpoint_keeping_the_attention_outputs(device, dropout):
    torch.manual_seed(0)
    block = AttentionBlock(dropout=dropout).to(device)
    x = torch.randn(2, 16, 32, device=device, requires_grad=True)

    def grads(run):
        block.zero_grad()
        x.grad = None
        torch.manual_seed(7)
        out = run()
        out.square().sum().backward()
        return [out.detach(), x.grad] + [p.grad for p in block.parameters()]

    ours = grads(lambda: torch_offload.selective_checkpoint(block, x, policy="attention", min_bytes=0))
    theirs = grads(lambda: torch_checkpoint(block, x, use_reentrant=False, context_fn=lambda: (
        create_selective_checkpoint_contexts(_attention_save_policy))))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


class _HooksAroundAttention(AttentionBlock):
    """A block whose attention saves go to the user's own saved-tensor hooks, not to the checkpoint."""

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, s, w))
        return x + self.mlp(x)


def test_an_attention_whose_saves_other_hooks_take_is_recomputed(counted):
    torch.manual_seed(0)
    block = _HooksAroundAttention()
    x = torch.randn(2, 16, 32, requires_grad=True)
    out = block(x)
    out.square().sum().backward()
    expected = [x.grad.clone()] + [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    x.grad = None
    counted["sdpa"] = 0
    _run(block, x)
    assert counted["sdpa"] == 2  # forward, then recomputed
    got = [x.grad] + [p.grad for p in block.parameters()]
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, expected))


def test_nothing_offloaded_outlives_the_step_or_a_dropped_graph():
    manager = torch_offload.OffloadManager()
    block = AttentionBlock()
    x = torch.randn(2, 16, 32, requires_grad=True)
    for backward in (True, False):
        out = torch_offload.selective_checkpoint(block, x, policy="attention", manager=manager, min_bytes=0)
        assert torch_offload.stats(manager)["live_handles"] > 0  # the block input and the attention outputs
        if backward:
            out.square().sum().backward()
        del out
        manager.synchronize()
        stats = torch_offload.stats(manager)
        assert stats["live_handles"] == 0 and stats["host_bytes_in_use"] == 0


class _ProjectingBlock(nn.Module):
    """q/k/v projections of the block's own input: their matrix products save views of it."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.self_attn = nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self.self_attn, name, nn.Linear(width, width))

    def forward(self, x):
        b, s, w = x.shape
        attn = self.self_attn
        q, k, v = (p(x).view(b, s, self.heads, w // self.heads).transpose(1, 2)
                   for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + attn.o_proj(out.transpose(1, 2).reshape(b, s, w))


@pytest.mark.parametrize("offset", [0, 1])
def test_projections_are_stood_in_for_from_views_of_their_recomputed_input(offset):
    # The block input comes back from host memory compact: at offset 1 of a larger tensor in forward,
    # the views its projections saved lie elsewhere in the restored one, so those calls run again.
    torch.manual_seed(0)
    block = _ProjectingBlock()
    base = torch.randn(2 + offset, 16, 32, requires_grad=True)

    def grads(run):
        block.zero_grad()
        base.grad = None
        out = run(base[offset:])
        out.square().sum().backward()
        return [out.detach(), base.grad] + [p.grad for p in block.parameters()]

    manager = torch_offload.OffloadManager()
    ours = grads(lambda x: torch_offload.selective_checkpoint(block, x, policy="attention+qkv+out_proj",
                                                              manager=manager, min_bytes=0))
    theirs = grads(lambda x: torch_checkpoint(block, x, use_reentrant=False))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    # the input, the attention output and logsumexp, four products: the views are not offloaded
    assert manager.stats()["saves"] == 1 + 2 + 4
