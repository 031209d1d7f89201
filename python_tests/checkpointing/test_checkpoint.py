"""torch_offload.checkpoint against torch.utils.checkpoint: gradients must be bit-identical."""
import copy
import functools

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts, noop_context_fn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import torch_offload
from python_tests.support.checkpoint_blocks import Block, _pair, _run
from python_tests.support.devices import DEVICES
from python_tests.support.grads import assert_same_grads
from python_tests.support.llama import _steps_match_plain, _tiny_llama


def _ours(block, h, **kwargs):
    return torch_offload.checkpoint(block, h, **kwargs)


def _torchs(block, h, **kwargs):
    return torch_checkpoint(block, h, use_reentrant=False, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_matches_torch_checkpoint_with_dropout(device):
    a, b, x = _pair(device)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    la = _run(a, xa, _ours)
    lb = _run(b, xb, _torchs)
    assert torch.equal(la, lb)
    assert_same_grads(a, b)
    assert torch.equal(xa.grad, xb.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_matches_plain_training_without_dropout(device):
    a, b, x = _pair(device, dropout=0.0)
    la = _run(a, x, _ours)
    lb = _run(b, x, lambda block, h: block(h))
    assert torch.equal(la, lb)
    assert_same_grads(a, b)


# Both variants of ours (use_reentrant=True: reentrant.py) against torch's non-reentrant checkpoint.
@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_kwargs_nested_and_non_tensor_args(device, use_reentrant):
    a, b, x = _pair(device, n=2)
    bias = torch.randn(32, device=device, requires_grad=True)
    gate = torch.rand(32, device=device, requires_grad=True)
    bias_b, gate_b = bias.detach().clone().requires_grad_(), gate.detach().clone().requires_grad_()
    ours = functools.partial(_ours, use_reentrant=use_reentrant)
    _run(a, x, ours, scale=0.5, bias=bias, extra={"gate": gate})
    _run(b, x, _torchs, scale=0.5, bias=bias_b, extra={"gate": gate_b})
    assert_same_grads(a, b)
    assert torch.equal(bias.grad, bias_b.grad) and torch.equal(gate.grad, gate_b.grad)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_inputs_without_grad_still_train_parameters(device, use_reentrant):
    # Frozen embeddings (LoRA) give a first layer input that does not require grad (torch's own
    # reentrant checkpoint would give the parameters no gradient here).
    a, b, x = _pair(device, n=2)
    assert not x.requires_grad
    _run(a, x, functools.partial(_ours, use_reentrant=use_reentrant))
    _run(b, x, _torchs)
    assert all(p.grad is not None for p in a.parameters())
    assert_same_grads(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_several_outputs_and_non_tensor_outputs(device):
    torch.manual_seed(0)
    lin = nn.Linear(8, 8).to(device)
    lin_b = copy.deepcopy(lin)

    def fn(layer, x):
        y = layer(x)
        return {"y": y, "y2": (y * 2, "tag"), "n": 3, "idx": torch.argmax(y, dim=-1)}

    x = torch.randn(5, 8, device=device, requires_grad=True)
    out = torch_offload.checkpoint(fn, lin, x)
    assert out["n"] == 3 and out["y2"][1] == "tag" and out["idx"].dtype == torch.int64
    (out["y"].sum() + out["y2"][0].sum()).backward()
    ref = fn(lin_b, x.detach())
    (ref["y"].sum() + ref["y2"][0].sum()).backward()
    assert torch.equal(lin.weight.grad, lin_b.weight.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_is_replayed_in_recompute(device):
    a, b, x = _pair(device, n=2)
    dtype = torch.bfloat16
    with torch.autocast(device_type=device, dtype=dtype):
        la = _run(a, x, _ours)
    with torch.autocast(device_type=device, dtype=dtype):
        lb = _run(b, x, _torchs)
    assert torch.equal(la, lb)
    assert_same_grads(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_twice_with_retain_graph(device):
    a, b, x = _pair(device, n=2, dropout=0.0)
    ha, hb = x, x
    for block in a:
        ha = _ours(block, ha)
    for block in b:
        hb = _torchs(block, hb)
    for _ in range(2):
        ha.sum().backward(retain_graph=True)
        hb.sum().backward(retain_graph=True)
    assert_same_grads(a, b)


def test_no_grad_runs_the_function_directly():
    block = Block(dropout=0.0)
    x = torch.randn(2, 32)
    manager = torch_offload.OffloadManager()
    with torch.no_grad():
        out = torch_offload.checkpoint(block, x, manager=manager)
    assert torch.equal(out, block(x)) and manager.stats()["saves"] == 0


def test_offloads_exactly_the_first_tensor_input():
    manager = torch_offload.OffloadManager()
    block = Block()
    x = torch.randn(2, 4, 32, requires_grad=True)
    bias = torch.randn(32, requires_grad=True)
    torch_offload.checkpoint(block, x, bias=bias, manager=manager).sum().backward()
    stats = manager.stats()
    assert stats["saves"] == 1 and stats["bytes_to_host"] == x.numel() * 4
    assert stats["restores"] == 1 and stats["live_handles"] == 0


def test_in_place_change_of_checkpoint_input_is_detected():
    block = Block(dropout=0.0)
    x = torch.randn(2, 4, 32)
    h = x.clone().requires_grad_()
    inner = h * 1.0
    out = torch_offload.checkpoint(block, inner)
    with torch.no_grad():
        inner.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place after it was saved"):
        out.sum().backward()


# --- torch's keywords: handled by checkpoint(), never passed to the user's function ---------------

class KwargsBlock(nn.Module):
    """A Hugging Face-style layer whose forward takes **kwargs: a leaked keyword would land here."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.seen = []

    def forward(self, x, **kwargs):
        self.seen.append(sorted(kwargs))
        return torch.tanh(self.fc(x))


def test_torch_keywords_do_not_reach_the_function():
    block = KwargsBlock()
    x = torch.randn(3, 8, requires_grad=True)
    out = torch_offload.checkpoint(block, x, use_reentrant=False, context_fn=noop_context_fn,
                                   determinism_check="none", debug=False, early_stop=False,
                                   preserve_rng_state=False, manager=torch_offload.OffloadManager())
    out.sum().backward()
    assert block.seen == [[], []]  # forward and recompute, both without keywords


def test_user_keywords_still_reach_the_function():
    block = KwargsBlock()
    x = torch.randn(3, 8, requires_grad=True)
    torch_offload.checkpoint(block, x, use_reentrant=False, attention_mask=None).sum().backward()
    assert block.seen == [["attention_mask"], ["attention_mask"]]


def test_bad_determinism_check_is_torchs_error():
    with pytest.raises(ValueError, match="determinism_check should be one of"):
        torch_offload.checkpoint(Block(), torch.randn(2, 32, requires_grad=True), determinism_check="x")


def test_early_stop_false_recomputes_the_whole_function():
    # Early stop ends the recompute once every saved tensor is rebuilt (here: sin's input), so the
    # code after it runs again only with early_stop=False.
    calls = []

    def fn(x):
        y = x.sin()
        calls.append("after the last saving op")
        return y * 2

    x = torch.randn(4, requires_grad=True)
    for early_stop, runs in ((True, 1), (False, 2)):
        calls.clear()
        torch_offload.checkpoint(fn, x, early_stop=early_stop).sum().backward()
        assert len(calls) == runs, early_stop


@pytest.mark.parametrize("policy", ["list", "function", "save_all_but_sin"])
def test_selective_checkpoint_context_fn_matches_torch(policy):
    # Our restore must be invisible to the user's policy: it runs outside the recompute's modes (a
    # policy saving every op it sees would otherwise look for the restore in its storage).
    def fn(x, y):
        return torch.sigmoid(torch.matmul(torch.matmul(x, y), y)).sin() * y

    seen = []

    def policy_fn(ctx, op, *args, **kwargs):
        seen.append(str(op))
        if policy == "save_all_but_sin":
            return CheckpointPolicy.PREFER_RECOMPUTE if op == torch.ops.aten.sin.default else CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    ops = [torch.ops.aten.mm.default] if policy == "list" else policy_fn
    context_fn = functools.partial(create_selective_checkpoint_contexts, ops)
    grads = []
    for run in (torch_offload.checkpoint, torch_checkpoint):
        torch.manual_seed(0)
        x, y = torch.rand(10, 10, requires_grad=True), torch.rand(10, 10, requires_grad=True)
        run(fn, x, y, use_reentrant=False, context_fn=context_fn).sum().backward()
        grads.append((x.grad, y.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    assert not any("offload" in op for op in seen)


def test_debug_true_runs():
    x = torch.randn(4, 32, requires_grad=True)
    block = Block(dropout=0.0)
    torch_offload.checkpoint(block, x, use_reentrant=False, debug=True).sum().backward()
    assert x.grad is not None


# --- Hugging Face: the model's own gradient_checkpointing_enable() path, offloading ----------------

def test_hf_gradient_checkpointing_func_offloads_and_matches_torch():
    ours, theirs = _tiny_llama("cpu", dropout=0.1), _tiny_llama("cpu", dropout=0.1)
    manager = torch_offload.OffloadManager()
    # The README one-liner (after the model's own gradient_checkpointing_enable()).
    ours.gradient_checkpointing_enable()
    ours._set_gradient_checkpointing(gradient_checkpointing_func=functools.partial(
        torch_offload.checkpoint, manager=manager))
    theirs.gradient_checkpointing_enable()
    assert ours.is_gradient_checkpointing and theirs.is_gradient_checkpointing
    _steps_match_plain(ours, theirs, "cpu", steps=1)
    stats = manager.stats()
    hidden_bytes = 2 * 32 * 64 * 4
    assert stats["saves"] == 3 and stats["bytes_to_host"] == 3 * hidden_bytes
    assert stats["restores"] == 3 and stats["live_handles"] == 0
