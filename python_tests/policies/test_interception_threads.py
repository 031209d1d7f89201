"""The named selective policies intercept SDPA and linear only inside the block being run, in the thread
running it (policies/interception.py): while a block runs, forward or recompute, another thread that
calls torch.nn.functional.linear / scaled_dot_product_attention gets torch's own functions, results
and nothing offloaded; other torch function modes, nested blocks and compiled regions keep working."""
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import torch_offload

_TORCH_SDPA = torch._C._nn.scaled_dot_product_attention
_TORCH_LINEAR = torch._C._nn.linear
WIDTH, HEADS = 32, 4


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, HEADS, WIDTH // HEADS).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(attn.transpose(1, 2).reshape(b, s, WIDTH))


class _Block(nn.Module):
    """A decoder block whose module names the projection presets know; `pause`, where set, is called
    at the start of every run of the block (its forward and its recompute)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.self_attn = _Attention()
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))
        self.pause = None

    def forward(self, x):
        if self.pause is not None:
            self.pause()
        x = x + self.self_attn(self.norm(x))
        return x + self.mlp(x)


def _grads(block, x, run):
    block.zero_grad(set_to_none=True)
    x.grad = None
    out = run()
    out.square().sum().backward()
    return [out.detach(), x.grad] + [p.grad for p in block.parameters()]


class _OtherThread:
    """Another thread that, each time the block pauses, calls torch.nn.functional's linear (with the
    block's own projection weight) and SDPA while the block's run waits, and records what it saw."""

    def __init__(self, block, manager, runs: int):
        self.block, self.manager, self.runs = block, manager, runs
        self.barrier = threading.Barrier(2, timeout=60)
        self.seen, self.errors = [], []
        torch.manual_seed(1)
        self.x = torch.randn(2, 8, WIDTH)
        self.q = torch.randn(1, HEADS, 8, WIDTH // HEADS)
        weight, bias = block.self_attn.q_proj.weight, block.self_attn.q_proj.bias
        with torch.no_grad():  # torch's own results, computed before any block runs
            self.expected = (_TORCH_LINEAR(self.x, weight, bias), _TORCH_SDPA(self.q, self.q, self.q))
        self.thread = threading.Thread(target=self._run)

    def pause(self):  # in the block's run: the other thread calls while this run is paused in it
        self.barrier.wait()
        self.barrier.wait()

    def _run(self):
        try:
            for _ in range(self.runs):
                self.barrier.wait()
                try:
                    self._calls()
                finally:
                    self.barrier.wait()
        except BaseException as error:  # reported by the test's thread
            self.errors.append(error)
            self.barrier.abort()

    def _calls(self):
        saves = self.manager.stats()["saves"]
        weight, bias = self.block.self_attn.q_proj.weight, self.block.self_attn.q_proj.bias
        with torch.no_grad():
            got = (F.linear(self.x, weight, bias), F.scaled_dot_product_attention(self.q, self.q, self.q))
        self.seen.append({
            "functions": (F.linear is _TORCH_LINEAR, F.scaled_dot_product_attention is _TORCH_SDPA),
            "equal": all(torch.equal(a, b) for a, b in zip(got, self.expected)),
            "saves moved": self.manager.stats()["saves"] - saves,
        })


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("policy", ["attention", "attention+qkv+out_proj"])
def test_another_thread_gets_torchs_functions_while_a_selective_block_runs(policy, use_reentrant):
    torch.manual_seed(0)
    block = _Block()
    x = torch.randn(2, 16, WIDTH, requires_grad=True)

    def ours(manager):
        return torch_offload.selective_checkpoint(block, x, policy=policy, manager=manager, min_bytes=0,
                                                  use_reentrant=use_reentrant)

    alone = torch_offload.OffloadManager()
    expected = _grads(block, x, lambda: ours(alone))
    manager = torch_offload.OffloadManager()
    other = _OtherThread(block, manager, runs=2)  # the block's forward, then its recompute
    block.pause = other.pause
    other.thread.start()
    try:
        got = _grads(block, x, lambda: ours(manager))
    finally:
        block.pause = None
        other.barrier.abort()
        other.thread.join(60)
    assert not other.errors, other.errors
    assert len(other.seen) == 2, "the other thread called once in the forward and once in the recompute"
    for seen in other.seen:
        assert seen == {"functions": (True, True), "equal": True, "saves moved": 0}
    # The block itself was intercepted as when it ran alone: the same saves, the same gradients.
    assert manager.stats()["saves"] == alone.stats()["saves"] > 1
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    theirs = _grads(block, x, lambda: torch_checkpoint(block, x, use_reentrant=False))
    assert all(torch.equal(a, b) for a, b in zip(got, theirs))


class _CountingMode(TorchFunctionMode):
    """A user's own torch function mode: counts the SDPA calls it sees."""

    def __init__(self):
        super().__init__()
        self.sdpa = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.sdpa += func is _TORCH_SDPA
        return func(*args, **(kwargs or {}))


class _BlockWithItsOwnMode(_Block):
    def forward(self, x):
        with self.mode:  # entered inside the block: above the interception
            return super().forward(x)


@pytest.mark.parametrize("where", ["around", "inside"])
def test_a_users_torch_function_mode_sees_the_calls_and_the_block_is_still_intercepted(where):
    torch.manual_seed(0)
    block = _Block() if where == "around" else _BlockWithItsOwnMode()
    block.mode = mode = _CountingMode()
    x = torch.randn(2, 16, WIDTH, requires_grad=True)
    theirs = _grads(block, x, lambda: torch_checkpoint(block, x, use_reentrant=False))
    mode.sdpa = 0
    manager = torch_offload.OffloadManager()

    def ours():
        if where == "inside":
            return torch_offload.selective_checkpoint(block, x, manager=manager, min_bytes=0)
        with mode:
            return torch_offload.selective_checkpoint(block, x, manager=manager, min_bytes=0)

    got = _grads(block, x, ours)
    assert all(torch.equal(a, b) for a, b in zip(got, theirs))
    assert manager.stats()["saves"] == 3  # the block input, the attention output and its logsumexp
    # Around the block the mode sees torch's SDPA run in forward only (the recompute stands in for it,
    # and a backward does not carry torch function modes); inside it sees the call in both runs.
    assert mode.sdpa == (1 if where == "around" else 2)


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.inner = _Block(), _Block()

    def forward(self, x):
        x = self.first(x)
        return torch_offload.selective_checkpoint(self.inner, x, manager=self.manager, min_bytes=0)


def test_nested_selective_blocks_intercept_each_call_once():
    torch.manual_seed(0)
    outer = _Outer()
    x = torch.randn(2, 16, WIDTH, requires_grad=True)
    outer.manager = None
    theirs = _grads(outer, x, lambda: torch_checkpoint(outer, x, use_reentrant=False))
    outer.manager = torch_offload.OffloadManager()
    got = _grads(outer, x, lambda: torch_offload.selective_checkpoint(outer, x, manager=outer.manager, min_bytes=0))
    assert all(torch.equal(a, b) for a, b in zip(got, theirs))
    # Each block's input, attention output and logsumexp, once: the inner attention call is the inner
    # block's alone (the outer block intercepting it too would offload it twice). The outer recompute
    # stops after its last save, in the first block.
    stats = outer.manager.stats()
    assert stats["saves"] == 3 + 3
    assert stats["live_handles"] == 0


def test_a_compiled_region_inside_a_block_is_recomputed_with_a_warning(monkeypatch):
    from torch_offload.policies import interception

    monkeypatch.setattr(interception, "_warned", False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = _Block()
    compiled = torch.compile(block, backend="aot_eager")
    x = torch.randn(2, 16, WIDTH, requires_grad=True)
    theirs = _grads(block, x, lambda: torch_checkpoint(block, x, use_reentrant=False))
    manager = torch_offload.OffloadManager()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _grads(block, x, lambda: torch_offload.selective_checkpoint(compiled, x, manager=manager,
                                                                         min_bytes=0))
    torch._dynamo.reset()
    assert any("made no call to torch.nn.functional.scaled_dot_product_attention" in str(w.message) for w in caught)
    assert manager.stats()["saves"] == 1  # the block input only
    for a, b in zip(got, theirs):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_the_recompute_is_intercepted_in_the_thread_that_runs_backward(use_reentrant):
    torch.manual_seed(0)
    block = _Block()
    x = torch.randn(2, 16, WIDTH, requires_grad=True)
    theirs = _grads(block, x, lambda: torch_checkpoint(block, x, use_reentrant=False))
    manager = torch_offload.OffloadManager()
    block.zero_grad(set_to_none=True)
    x.grad = None
    out = torch_offload.selective_checkpoint(block, x, manager=manager, min_bytes=0, use_reentrant=use_reentrant)
    errors = []

    def backward():
        try:
            out.square().sum().backward()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=backward)
    thread.start()
    thread.join(60)
    assert not errors, errors
    got = [out.detach(), x.grad] + [p.grad for p in block.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(got, theirs))
    # The attention output and logsumexp came back from the host there: the recompute in that
    # thread was intercepted (run again, it would have restored the block input only).
    stats = manager.stats()
    assert stats["saves"] == stats["restores"] == 3
