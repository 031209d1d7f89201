"""Selective offload (torch_offload.selective): gradients bit-equal to torch's selective checkpointing
keeping the same ops on the device (MUST_SAVE), the offloaded outputs going through the manager."""
import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import torch_offload
from python_tests.support.devices import DEVICES, cuda_only
from python_tests.support.grads import assert_same_grads
from python_tests.support.llama import _steps_match_plain, _tiny_llama
from python_tests.support.selective import AttentionBlock
from torch_offload import policies

torch_sac_attention = functools.partial(create_selective_checkpoint_contexts, policies.attention_save)


def _stack(device, dropout, n=3):
    torch.manual_seed(0)
    return nn.ModuleList(AttentionBlock(dropout=dropout) for _ in range(n)).to(device)


def _train(blocks, x, run):
    torch.manual_seed(1234)
    h = x
    for block in blocks:
        h = run(block, h)
    loss = h.square().mean()
    loss.backward()
    return loss


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_attention_policy_matches_torch_sac_keeping_attention(device, dropout):
    ours, theirs = _stack(device, dropout), _stack(device, dropout)
    x = torch.randn(2, 16, 32, device=device)
    manager = torch_offload.OffloadManager()
    la = _train(ours, x, lambda b, h: torch_offload.selective_checkpoint(b, h, manager=manager, min_bytes=0))
    lb = _train(theirs, x, lambda b, h: torch_checkpoint(b, h, use_reentrant=False, context_fn=torch_sac_attention))
    assert torch.equal(la, lb)
    assert_same_grads(ours, theirs)
    # Per block: the input (2*16*32 fp32), the attention output (same size) and its logsumexp (2*4*16).
    # On CUDA the fused kernels pad the logsumexp (to 32 rows) and return the dropout RNG state
    # (two int64), which are saved and offloaded too: 528 more bytes per block measured on an H100.
    stats = manager.stats()
    per_block = 2 * 16 * 32 * 4 * 2 + 2 * 4 * 16 * 4
    if device == "cpu":
        assert stats["bytes_to_host"] == 3 * per_block
        assert stats["saves"] == 9
    else:
        assert 3 * per_block <= stats["bytes_to_host"] <= 3 * (per_block + 1024)
    assert stats["restores"] == stats["saves"] and stats["live_handles"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_attention_policy_matches_plain_training_without_dropout(device):
    ours, plain = _stack(device, 0.0), _stack(device, 0.0)
    x = torch.randn(2, 16, 32, device=device)
    la = _train(ours, x, lambda b, h: torch_offload.selective_checkpoint(b, h, min_bytes=0))
    lb = _train(plain, x, lambda b, h: b(h))
    assert torch.equal(la, lb)
    assert_same_grads(ours, plain)


@pytest.mark.parametrize("policy", ["attention", "attention_qkv"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_llama_apply_selective_matches_hf_with_torch_sac(dropout, policy):
    # "attention_qkv": the q/k/v products come back from host memory in the recompute instead of
    # being recomputed: the same values, so gradients stay bit-equal to torch's selective checkpointing.
    ours, theirs = _tiny_llama("cpu", dropout), _tiny_llama("cpu", dropout)
    handle = torch_offload.apply(ours, "selective", ours.model.layers, policy=policy, min_bytes=0)
    theirs.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
        "use_reentrant": False, "context_fn": torch_sac_attention})
    _steps_match_plain(ours, theirs, "cpu", steps=2)
    stats = handle.stats()
    hidden = 2 * 32 * 64 * 4
    # With attention dropout, SDPA on CPU runs as math ops (no fused op to offload): inputs only.
    attention = 0 if dropout else hidden + 2 * 4 * 32 * 4
    # q (4 heads), k and v (2 heads) of 16
    projections = 2 * 32 * (64 + 32 + 32) * 4 if policy == "attention_qkv" else 0
    assert stats["bytes_to_host"] == 2 * 3 * (hidden + attention + projections)
    assert stats["live_handles"] == 0
    handle.remove()
    assert F.linear is torch._C._nn.linear and "forward" not in ours.model.layers[0].__dict__


def test_torch_policy_with_must_cpu_offload_and_restored_layout():
    # A user policy in torch's terms; the offloaded outputs are a transpose-like permuted result
    # (sort along dim 0 of a transposed input) and must come back with their strides.
    seen = {}

    def fn(x):
        values, indices = torch.sort(x.t(), dim=1)
        seen.setdefault("strides", []).append(values.stride())
        return (values * 2).exp().sum() + indices.float().sum()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_CPU_OFFLOAD if op == torch.ops.aten.sort.default else CheckpointPolicy.PREFER_RECOMPUTE

    manager = torch_offload.OffloadManager()
    x = torch.randn(64, 48, requires_grad=True)
    out = torch_offload.selective_checkpoint(fn, x, policy=policy, manager=manager, min_bytes=0)
    out.backward()
    ref = x.detach().clone().requires_grad_()
    fn(ref).backward()
    assert torch.equal(x.grad, ref.grad)
    forward_strides, recompute_strides = seen["strides"][:2]  # the recompute sees the restored values
    assert forward_strides == recompute_strides == (1, 48)
    assert manager.stats()["bytes_to_host"] == 64 * 48 * 4 * 2 + 64 * 48 * 8  # input, values, indices


@pytest.mark.parametrize("make", [lambda: torch.randn(6, 8).t(), lambda: torch.randn(6, 8)[:, ::2],
                                  lambda: torch.randn(6, 1).expand(6, 5)])
def test_offloaded_values_come_back_with_sizes_strides_and_dtype(make):
    from torch_offload.policies.store import OffloadStore as _Offloaded

    value = make().to(torch.float64)
    offloaded = _Offloaded(torch_offload.OffloadManager(), min_bytes=0)
    offloaded.save("op", (value, 3))
    restored, three = offloaded.restore("op")
    assert three == 3 and restored.dtype == value.dtype
    assert restored.shape == value.shape and restored.stride() == value.stride() and torch.equal(restored, value)


def test_layouts_seen_before_come_back_alike():
    # The recipe of each layout is worked out once (saved_regions.compact_recipe): a second tensor of
    # the same sizes and strides, and one of the same sizes with other strides, come back exactly.
    from torch_offload.policies.store import OffloadStore as _Offloaded

    offloaded = _Offloaded(torch_offload.OffloadManager(), min_bytes=0)
    values = [torch.randn(4, 6, 8).transpose(0, 1) for _ in range(2)] + [torch.randn(8, 4, 6).permute(2, 1, 0),
                                                                          torch.randn(6, 4, 16)[:, :, ::2],
                                                                          torch.randn(6, 4, 8)]
    for value in values:
        offloaded.save("op", value)
    for value in values:
        restored = offloaded.restore("op")
        assert restored.stride() == value.stride() and torch.equal(restored, value)


def test_outputs_below_min_bytes_stay_on_the_device():
    manager = torch_offload.OffloadManager()
    block = AttentionBlock()
    x = torch.randn(2, 16, 32, requires_grad=True)
    torch_offload.selective_checkpoint(block, x, manager=manager, min_bytes=1 << 20).sum().backward()
    assert manager.stats()["bytes_to_host"] == x.numel() * 4  # only the checkpoint input


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown policy='attn'"):
        torch_offload.apply(nn.Linear(2, 2), "selective", [nn.Linear(2, 2)], policy="attn")
    with pytest.raises(ValueError, match="OpOverloads"):
        torch_offload.selective_checkpoint(lambda t: t.sin(), torch.randn(2, requires_grad=True),
                                           policy=[torch.ops.aten.sin])


def test_offloaded_output_modified_in_place_is_detected():
    def fn(x):
        y = x.sort(dim=0).values
        out = y.exp()
        y.mul_(2)  # y was offloaded when sort returned it
        return out

    policy = lambda ctx, op, *a, **k: (CheckpointPolicy.MUST_CPU_OFFLOAD if op == torch.ops.aten.sort.default
                                       else CheckpointPolicy.PREFER_RECOMPUTE)
    out = torch_offload.selective_checkpoint(fn, torch.randn(8, 8, requires_grad=True), policy=policy, min_bytes=0)
    with pytest.raises(RuntimeError, match="modified in place after it was saved"):
        out.sum().backward()


def test_backward_twice_is_a_clear_error():
    block = AttentionBlock()
    out = torch_offload.selective_checkpoint(block, torch.randn(2, 16, 32, requires_grad=True), min_bytes=0)
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward an extra time"):
        out.sum().backward()


def test_context_fn_is_refused_by_selective_checkpoint():
    with pytest.raises(ValueError, match="pass policy=, not context_fn="):
        torch_offload.selective_checkpoint(lambda t: t, torch.randn(2, requires_grad=True), context_fn=None)


def test_apply_selective_only_in_training_with_grad():
    model = nn.Sequential(AttentionBlock(), AttentionBlock())
    manager = torch_offload.OffloadManager()
    handle = torch_offload.apply(model, "selective", list(model), manager)
    x = torch.randn(2, 16, 32)
    model.eval()
    model(x).sum()
    with torch.no_grad():
        model.train()
        model(x)
    assert manager.stats()["saves"] == 0
    copy_before = copy.deepcopy(model)
    handle.remove()
    assert torch.equal(model(x), copy_before(x))


def _block_seeing_modes(seen):
    """An AttentionBlock that records, outside its SDPA call, whether a dispatch mode is active."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    block = AttentionBlock()
    forward = block.forward

    def recording_forward(x):
        seen.append(_get_current_dispatch_mode() is not None)
        # "attention" has no projections to intercept: every linear call stays torch's own.
        assert F.linear is torch._C._nn.linear
        return forward(x)

    block.forward = recording_forward
    return block


@pytest.mark.parametrize("device", DEVICES)
def test_attention_by_name_runs_without_a_mode_per_op_and_matches_the_policy_function(device):
    # policy="attention" intercepts only the SDPA call; the policy function takes the per-op path
    # through dispatch modes. Same offloads, same gradients, bit for bit.
    seen_fast, seen_per_op = [], []
    fast, per_op = _block_seeing_modes(seen_fast).to(device), _block_seeing_modes(seen_per_op).to(device)
    per_op.load_state_dict(fast.state_dict())
    x = torch.randn(2, 16, 32, device=device)
    m_fast, m_per_op = torch_offload.OffloadManager(), torch_offload.OffloadManager()
    la = _train([fast], x, lambda b, h: torch_offload.selective_checkpoint(b, h, manager=m_fast, min_bytes=0))
    lb = _train([per_op], x, lambda b, h: torch_offload.selective_checkpoint(
        b, h, manager=m_per_op, policy=policies.attention, min_bytes=0))
    assert torch.equal(la, lb)
    assert_same_grads(fast, per_op)
    for key in ("saves", "restores", "bytes_to_host"):
        assert m_fast.stats()[key] == m_per_op.stats()[key]
    assert seen_fast == [False, False]  # forward and recompute: no mode around the block's ops
    assert seen_per_op == [True, True]
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention  # put back


@pytest.mark.parametrize("device", DEVICES)
def test_attention_by_name_under_a_users_dispatch_mode(device):
    # The intercepted call's mode hides the attention outputs' offload and every restore from a mode
    # the user entered around training (a FLOP counter, a tracer): it sees the model's ops and the
    # block inputs' saves (made outside the checkpoint), and the gradients do not change.
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Recording(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func] += 1
            return func(*args, **(kwargs or {}))

    x = torch.randn(2, 16, 32, device=device)
    plain_blocks, blocks = _stack(device, 0.0), _stack(device, 0.0)
    manager = torch_offload.OffloadManager()
    _train(plain_blocks, x, lambda b, h: torch_checkpoint(b, h, use_reentrant=False))
    recording = Recording()
    with recording:
        _train(blocks, x, lambda b, h: torch_offload.selective_checkpoint(b, h, manager=manager, min_bytes=0))
    assert_same_grads(plain_blocks, blocks)
    offload_ops = {str(op): n for op, n in recording.ops.items() if op.namespace == "offload"}
    assert offload_ops == {"offload.offload_save.default": 3}  # the 3 block inputs
    assert recording.ops[torch.ops.aten.mm.default] > 0
    stats = manager.stats()
    # each block's input, attention output and logsumexp (and on CUDA the dropout RNG state)
    assert stats["saves"] == stats["restores"] >= 3 * 3


def test_attention_by_name_leaves_other_threads_sdpa_alone():
    import threading

    other = {}
    q = torch.randn(1, 2, 16, 8)

    def other_thread_call():
        other["out"] = F.scaled_dot_product_attention(q, q, q)

    def fn(x):  # while this block runs, another thread's SDPA call must not be offloaded
        thread = threading.Thread(target=other_thread_call)
        thread.start()
        thread.join()
        return AttentionBlock()(x)

    manager = torch_offload.OffloadManager()
    x = torch.randn(2, 16, 32, requires_grad=True)
    torch_offload.selective_checkpoint(fn, x, manager=manager, min_bytes=0).sum().backward()
    # This block's input, attention output and logsumexp: nothing from the other thread.
    assert manager.stats()["saves"] == 3
    assert torch.equal(other["out"], torch._C._nn.scaled_dot_product_attention(q, q, q))


def test_attention_by_name_intercepts_sdpa_imported_before_the_block_ran():
    from torch.nn.functional import scaled_dot_product_attention as sdpa_imported_early

    def fn(x):
        q = x.view(2, 16, 4, 8).transpose(1, 2)
        return sdpa_imported_early(q, q, q, is_causal=True).sum()

    manager = torch_offload.OffloadManager()
    x = torch.randn(2, 16, 32, requires_grad=True)
    torch_offload.selective_checkpoint(fn, x, manager=manager, min_bytes=0).backward()
    expected = x.grad.clone()
    x.grad = None
    fn(x).backward()
    assert manager.stats()["saves"] == 3  # the block input, the attention output and its logsumexp
    assert torch.equal(expected, x.grad)


def test_attention_by_name_warns_when_the_block_does_not_call_sdpa(monkeypatch):
    from torch_offload.policies import interception as attention_offload

    monkeypatch.setattr(attention_offload, "_warned", False)

    def fn(x):  # attention through the aten op, not torch.nn.functional's function
        q = x.view(2, 16, 4, 8).transpose(1, 2)
        return torch.ops.aten.scaled_dot_product_attention.default(q, q, q, is_causal=True).sum()

    x = torch.randn(2, 16, 32, requires_grad=True)
    with pytest.warns(UserWarning, match="policy=torch_offload.policies.attention"):
        torch_offload.selective_checkpoint(fn, x, min_bytes=0).backward()
    assert x.grad is not None


# Linear products per layer that the group spares the recompute. torch's non-reentrant checkpoint
# (under use_reentrant=False) stops its recompute early, before the MLP's down projection, whose
# output backward does not need: offloading it spares nothing there. The reentrant variant reruns
# the whole block, down projection included, unless "fc2" is offloaded.
@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("policy,spared", [("attention_qkv", (3, 3)), ("attention+fc2", (0, 1)),
                                           ("attention+out_proj+fc2", (1, 2)),
                                           ("attention+qkv+out_proj+fc1+fc2", (6, 7))])
def test_projection_groups_skip_their_products_in_the_recompute(policy, spared, use_reentrant):
    from python_tests.support.selective import matmuls_in_backward

    # 3 layers x the group's Linear modules: products restored, not recomputed.
    matmuls = [matmuls_in_backward(use_reentrant, policy=p)[0] for p in ("attention", policy)]
    assert matmuls[0] - matmuls[1] == 3 * spared[use_reentrant]


def test_projection_group_errors_name_the_case():
    with pytest.raises(ValueError, match="has no Linear modules in module preset 'qkv'"):
        torch_offload.apply(nn.Sequential(nn.Linear(2, 2)), "selective", policy="attention_qkv",
                            blocks=[nn.Linear(2, 2)])
    with pytest.raises(ValueError, match=r"policy='attention\+mlp'.*projection groups among"):
        torch_offload.apply(nn.Sequential(nn.Linear(2, 2)), "selective", policy="attention+mlp")
    with pytest.raises(ValueError, match="projection groups among"):
        torch_offload.apply(nn.Sequential(nn.Linear(2, 2)), "selective", policy="attention+fc2+fc2")
    with pytest.raises(ValueError, match="pass the block as `function`"):
        torch_offload.selective_checkpoint(lambda t: t.sin(), torch.randn(2, requires_grad=True),
                                           policy="attention_qkv")
    with pytest.raises(ValueError, match="'attention_qkv' .projection groups. needs the blocks' modules"):
        torch_offload.selective_offload_contexts("attention_qkv")


class SelfAndCrossAttentionBlock(nn.Module):
    """Two attention calls per block, as a video DiT's self- and cross-attention: five saves under
    "attention" (the input, and each call's output and logsumexp)."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.q, self.kv = nn.Linear(width, 3 * width), nn.Linear(width, width), nn.Linear(width, 2 * width)
        self.out1, self.out2 = nn.Linear(width, width), nn.Linear(width, width)

    def _heads(self, t):
        b, s, w = t.shape
        return t.view(b, s, self.heads, w // self.heads).transpose(1, 2)

    def _merge(self, t):
        return t.transpose(1, 2).flatten(2)

    def forward(self, x, context):
        q, k, v = (self._heads(t) for t in self.qkv(x).chunk(3, dim=-1))
        x = x + self.out1(self._merge(F.scaled_dot_product_attention(q, k, v)))
        k, v = (self._heads(t) for t in self.kv(context).chunk(2, dim=-1))
        return x + self.out2(self._merge(F.scaled_dot_product_attention(self._heads(self.q(x)), k, v)))


class SelfAndCrossAttentionStack(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.blocks = nn.ModuleList(SelfAndCrossAttentionBlock() for _ in range(n))

    def forward(self, x, context):
        for block in self.blocks:
            x = block(x, context)
        return x


def _cross_attention_step(model, device="cpu", tokens=16):
    torch.manual_seed(7)
    x, context = torch.randn(2, tokens, 32, device=device), torch.randn(2, 8, 32, device=device)
    model(x, context).square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_default_prefetch_depth_rises_to_the_saves_of_a_block_with_two_attention_calls():
    # The policy says three saves per block; the first training forward counts five, so that restoring
    # a block's input prefetches all of the previous block's saves. A deep copy counts for its own manager.
    torch.manual_seed(0)
    model = SelfAndCrossAttentionStack()
    plain = copy.deepcopy(model)
    handle = torch_offload.apply(model, "selective", list(model.blocks), min_bytes=0)
    twin, twin_handle = copy.deepcopy((model, handle))
    assert handle.manager.prefetch_depth() == 3
    model.eval()
    _cross_attention_step(model)  # not training: nothing saved, nothing counted
    model.zero_grad()
    model.train()
    assert handle.manager.prefetch_depth() == 3
    grads = _cross_attention_step(model)
    assert handle.stats()["saves"] == 3 * 5
    assert handle.manager.prefetch_depth() == 5
    assert twin_handle.manager.prefetch_depth() == 3
    _cross_attention_step(twin)
    assert twin_handle.manager.prefetch_depth() == 5
    for ours, theirs in zip(grads, _cross_attention_step(plain)):
        assert torch.equal(ours, theirs)
    handle.remove()
    twin_handle.remove()


def test_a_prefetch_depth_given_or_a_users_manager_is_left_as_it_is():
    model = SelfAndCrossAttentionStack()
    given = copy.deepcopy(model)
    handle = torch_offload.apply(given, "selective", list(given.blocks), prefetch_depth=2, min_bytes=0)
    _cross_attention_step(given)
    assert handle.stats()["saves"] == 3 * 5 and handle.manager.prefetch_depth() == 2
    handle.remove()
    owned = copy.deepcopy(model)
    manager = torch_offload.OffloadManager()  # its own depth: 1
    handle = torch_offload.apply(owned, "selective", list(owned.blocks), manager)
    _cross_attention_step(owned)
    assert manager.prefetch_depth() == 1
    handle.remove()


def test_transformers_route_counts_the_saves_of_each_layer():
    # gradient_checkpointing_enable(model, "selective"): each layer's first forward counts its saves
    # too (a Llama layer makes three: the depth the policy gives, restored here after lowering it).
    model = _tiny_llama("cpu", dropout=0.0)
    handle = torch_offload.integrations.gradient_checkpointing_enable(model, "selective", min_bytes=0)
    assert handle.manager.prefetch_depth() == 3
    handle.manager.set_prefetch_depth(1)
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    assert handle.manager.prefetch_depth() == 3
    handle.remove()


@cuda_only
def test_every_restore_but_the_last_blocks_is_prefetched_with_two_attention_calls():
    # Without the raised depth, each block's first restore prefetched three of the previous block's
    # five saves and backward waited for the other two's copies.
    # 128 tokens and min_bytes=1024: every output and logsumexp is offloaded, the memory-efficient
    # kernel's random-number seed and offset (a few bytes) are not.
    torch.manual_seed(0)
    model = SelfAndCrossAttentionStack().cuda()
    handle = torch_offload.apply(model, "selective", list(model.blocks), min_bytes=1024)
    for _ in range(2):
        handle.manager.reset_stats()
        model.zero_grad()
        _cross_attention_step(model, "cuda", tokens=128)
    handle.manager.synchronize()
    stats = handle.stats()
    assert stats["saves"] == stats["restores"] == 3 * 5
    assert handle.manager.prefetch_depth() == 5
    # The last block's saves are backward's first restores: with no LM head, nothing precedes them.
    assert stats["restores"] - stats["prefetch_hits"] == 5, stats
    handle.remove()
