"""Deduplicated saves (csrc/saved_regions.h, through saved_regions.py): a storage region saved several times, or through several
views, is copied once; every save comes back with its own layout and dtype; in-place changes and
reused addresses are never confused with the saved data. Gradients are compared bit for bit with
plain autograd."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_offload
from python_tests.support.devices import DEVICES
from python_tests.support.llama import _steps_match_plain, _tiny_llama

# Every test here runs with the C save hooks and with the Python ones (conftest.save_hooks).
pytestmark = pytest.mark.usefixtures("save_hooks")


def _grads_match(fn, inputs, **hook_options):
    """Runs fn(*inputs) backward with and without the hooks; returns the hooks' stats."""
    ref = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    ours = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    fn(*ref).backward()
    hooks = torch_offload.offload_activations("all", min_bytes=0, **hook_options)
    with hooks:
        loss = fn(*ours)
    loss.backward()
    for r, o in zip(ref, ours):
        if r.requires_grad:
            assert torch.equal(r.grad, o.grad)
    return hooks.stats()


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_and_transpose_copied_once_with_their_own_strides(device):
    a = torch.randn(8, 6, device=device, requires_grad=True)
    w = torch.randn(8, 5, device=device, requires_grad=True)
    hooks = torch_offload.offload_activations("all", min_bytes=0)
    with hooks:
        h = a * 2
        mm = h.t() @ w  # saves h.t() (for w's grad)
        sq = h * h  # saves h twice
    saved_t, saved_h = mm.grad_fn._saved_self, sq.grad_fn._saved_self  # unpacked through the hooks
    assert saved_t.stride() == h.t().stride() and torch.equal(saved_t, h.t())
    assert saved_h.stride() == h.stride() and torch.equal(saved_h, h)
    stats = hooks.stats()
    assert stats["offloaded_saves"] == 3 and stats["saves"] == 1
    assert stats["bytes_to_host"] == stats["distinct_bytes_saved"] == h.nbytes

    def fn(a, w):
        h = a * 2
        return (h.t() @ w).sum() + (h * h).sum()

    stats = _grads_match(fn, [a, w])
    assert stats["saves"] == stats["restores"] == 1  # restored once per backward, shared by 3 saves


@pytest.mark.parametrize("device", DEVICES)
def test_overlapping_views_copy_the_union(device):
    row = 8 * 4  # bytes of one row of h

    def fn(a):
        h = a * 1.5
        v1, v2, v3 = h[2:7], h[4:9], h[3:8]  # v3 lies inside the union of v1 and v2
        return v1.sin().sum() + v2.cos().sum() + v3.square().sum()  # each saves its input

    a = torch.randn(40, 8, device=device, requires_grad=True)
    stats = _grads_match(fn, [a])
    # v1 copied (rows 2-6); v2 overlaps it: the union (rows 2-8) copied; v3 reuses the union.
    assert stats["saves"] == 2 and stats["shared_saves"] == 1
    assert stats["bytes_to_host"] == (5 + 7) * row
    assert stats["distinct_bytes_saved"] == 7 * row


@pytest.mark.parametrize("device", DEVICES)
def test_contiguous_slice_over_half_the_storage_then_the_rest(device):
    # The first slice is contiguous and covers most of its storage, so its copy is widened to the
    # whole storage; the second slice must find its own rows there. (The Python table of sessions
    # 2-11 copied only the first slice's rows while recording the whole range, and the second save
    # read bytes past them: gradients off by 1e17.)
    def fn(a, w):
        h = a * 2
        return (h[:300] @ w).sum() + (h[300:] @ w).sum()  # each matmul saves its slice

    a = torch.randn(400, 16, device=device, requires_grad=True)
    w = torch.randn(16, 16, device=device, requires_grad=True)
    stats = _grads_match(fn, [a, w])
    assert stats["offloaded_saves"] == 2 and stats["distinct_bytes_saved"] == 400 * 16 * 4


@pytest.mark.parametrize("device", DEVICES)
def test_slices_of_a_fused_projection_share_one_whole_storage_copy(device):
    def fn(a):
        qkv = a * 2
        q, k, v = qkv[:, :8], qkv[:, 8:10], qkv[:, 10:]  # q covers most of the storage
        return q.sin().sum() + k.cos().sum() + v.square().sum()

    a = torch.randn(16, 12, device=device, requires_grad=True)
    stats = _grads_match(fn, [a])
    assert stats["saves"] == 1 and stats["bytes_to_host"] == 16 * 12 * 4


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_view_copies_only_its_elements(device):
    def fn(a):
        h = a * 2
        s = h[:, ::4]
        return s.sin().sum() + s.cos().sum()  # the same sparse view saved twice: one copy

    a = torch.randn(16, 32, device=device, requires_grad=True)
    stats = _grads_match(fn, [a])
    assert stats["saves"] == 1 and stats["bytes_to_host"] == 16 * 8 * 4
    assert stats["distinct_bytes_saved"] == 16 * 8 * 4


def test_in_place_change_between_two_saves_is_an_error_at_backward():
    def fn(a, used_first):
        h = a * 2
        y1 = h.sin()  # saves h at version 0
        h.mul_(3)
        y2 = h.cos()  # saves h at version 1: must not reuse the version-0 copy
        return (y1.sum() if used_first else 0) + y2.sum()

    a = torch.randn(32, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        fn(a, True).backward()  # autograd's own behaviour
    with torch_offload.offload_activations("all", min_bytes=0) as hooks:
        loss = fn(a, True)
    assert hooks.stats()["saves"] == 2  # the second save copied again
    with pytest.raises(RuntimeError, match="modified in place"):
        loss.backward()
    # Only the second save used: backward runs and matches autograd (not the stale first copy).
    stats = _grads_match(lambda t: fn(t, False), [a])
    assert stats["saves"] == 2


def test_in_place_change_during_backward_between_two_unpacks_is_an_error():
    a = torch.randn(32, requires_grad=True)
    with torch_offload.offload_activations("all", min_bytes=0) as hooks:
        h = a * 2
        s, c = h.sin(), h.cos()  # one copy of h, unpacked twice in backward
    # CosBackward runs first (restores the copy); this hook runs before SinBackward unpacks.
    def modify_h(grad):
        with torch.no_grad():
            h.add_(1)

    s.register_hook(modify_h)
    with pytest.raises(RuntimeError, match="modified in place"):
        (s.sum() + c.sum()).backward()
    assert hooks.stats()["restores"] == 1  # the second unpack used the restored copy, and checked


def test_freed_storage_whose_address_is_reused_is_not_confused():
    # A storage is freed and a new one gets its address (here: two tensors over one numpy buffer,
    # the first released before the second exists). Keyed by data_ptr, the second save would
    # reuse the first one's copy.
    np = pytest.importorskip("numpy")
    buffer = np.arange(256, dtype=np.float32)
    x = torch.randn(256, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_()
    with torch_offload.offload_activations("all", min_bytes=0) as hooks:
        s1 = torch.from_numpy(buffer)
        address = s1.untyped_storage().data_ptr()
        out1 = x * s1  # saves s1 (for x's grad)
        del s1
        buffer *= -3  # the memory now holds other data ...
        s2 = torch.from_numpy(buffer)  # ... behind a new storage at the same address
        assert s2.untyped_storage().data_ptr() == address
        out2 = x * s2  # saves s2: must be copied, not served by s1's copy
    (out1.sum() + out2.sum()).backward()
    ref_s2 = torch.from_numpy(buffer.copy())
    ((ref_x * (ref_s2 / -3)).sum() + (ref_x * ref_s2).sum()).backward()
    assert torch.equal(x.grad, ref_x.grad)
    assert hooks.stats()["saves"] == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_freed_cuda_storage_whose_block_is_reused_is_not_confused():
    x = torch.randn(1 << 16, device="cuda", requires_grad=True)
    ref_x = x.detach().clone().requires_grad_()
    with torch_offload.offload_activations("sync", min_bytes=0) as hooks:
        y = x * 2
        address = y.data_ptr()
        out1 = y.sin()  # saves y; the synchronous copy releases y's block
        del y
        z = x * 3  # the caching allocator hands out the same block
        assert z.data_ptr() == address
        out2 = z.sin()
    (out1.sum() + out2.sum()).backward()
    ((ref_x * 2).sin().sum() + (ref_x * 3).sin().sum()).backward()
    assert torch.equal(x.grad, ref_x.grad)
    assert hooks.stats()["saves"] == 2


def test_alias_with_its_own_version_counter_is_copied_again():
    # y.data shares y's storage but not its version counter: a change through it leaves y's
    # version as it was, so only the view family (not the storage and version) may share a copy.
    a = torch.randn(64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    with torch_offload.offload_activations("all", min_bytes=0) as hooks:
        y = a * 2
        y.mul_(1)  # y at version 1
        kept = y.sin()  # saves y at version 1
        alias = y.data  # version 0
        alias.mul_(3)  # version 1; the storage changed, y's version did not
        loss = (alias * w).sum()  # saves alias at version 1: must not get y's copy
    loss.backward()
    assert torch.equal(w.grad, a.detach() * 6)
    assert hooks.stats()["saves"] == 2
    del kept


def test_views_across_dtypes():
    # x's float bits are small integers; x.view(torch.int32) indexes an embedding (saved as int32)
    # and x itself is saved by a multiplication: one float storage saved as float and as int32.
    bits = torch.randint(0, 10, (6, 4), dtype=torch.int32)
    table = torch.randn(10, 3, requires_grad=True)
    w = torch.randn(6, 4, requires_grad=True)

    def fn(table, w):
        x = bits.view(torch.float32) * 1.0  # a float intermediate with the same bits
        idx = x.view(torch.int32)
        return F.embedding(idx, table).sum() + (x * w).sum() * 1e30

    hooks = torch_offload.offload_activations("all", min_bytes=0)
    with hooks:
        loss = fn(table, w)
    emb_backward = loss.grad_fn.next_functions[0][0].next_functions[0][0]
    assert type(emb_backward).__name__ == "EmbeddingBackward0"
    saved_idx = emb_backward._saved_indices
    assert saved_idx.dtype == torch.int32 and torch.equal(saved_idx, bits)
    stats = _grads_match(fn, [table, w])
    assert stats["live_handles"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_linear_input_shared_by_q_k_v_is_copied_once(device):
    torch.manual_seed(0)
    q_proj, k_proj, v_proj = (nn.Linear(16, 16, bias=False).to(device) for _ in range(3))
    params = [p for m in (q_proj, k_proj, v_proj) for p in m.parameters()]
    inp = torch.randn(2, 10, 16, device=device)

    def fn(*_):
        x = inp * 2  # the normalised hidden states in a decoder layer
        q, k, v = q_proj(x), k_proj(x), v_proj(x)  # each saves (a reshaped view of) x
        return (q * k).sum() + v.square().sum()

    fn().backward()
    ref_grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    hooks = torch_offload.offload_activations("all", min_bytes=0)
    with hooks:
        loss = fn()
    loss.backward()
    assert all(torch.equal(p.grad, r) for p, r in zip(params, ref_grads))
    stats = hooks.stats()
    # Distinct storages offloaded: x, q, k, v (same size); x is saved three times.
    assert stats["bytes_to_host"] == stats["distinct_bytes_saved"] == 4 * inp.nbytes
    assert stats["shared_saves"] >= 2


def test_retain_graph_restores_again_in_each_backward():
    a = torch.randn(64, requires_grad=True)
    with torch_offload.offload_activations("all", min_bytes=0) as hooks:
        h = a * 2
        loss = h.sin().sum() + h.cos().sum()
    loss.backward(retain_graph=True)
    first = a.grad.clone()
    loss.backward()
    assert torch.equal(a.grad, 2 * first)
    assert hooks.stats()["restores"] == 2  # one per backward, shared by both saves


def test_host_memory_is_released_with_the_last_save():
    a = torch.randn(1024, requires_grad=True)
    hooks = torch_offload.offload_activations("all", min_bytes=0)
    with hooks:
        h = a * 2
        s = h.sin()  # saves h
    with hooks:
        c = h.cos()  # saves h again, in another graph: the copy is shared
    assert hooks.stats()["saves"] == 1 and hooks.regions.live_storages() == 1
    torch.autograd.grad(s.sum(), h)  # runs s's graph only (c's shares h's grad_fn)
    del s
    assert hooks.stats()["host_bytes_in_use"] == 4096  # c's graph still holds the copy
    c.sum().backward()
    del c, h
    stats = hooks.stats()
    assert stats["host_bytes_in_use"] == 0 and stats["live_handles"] == 0
    assert hooks.regions.live_storages() == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["all", "sync", "modules"])
def test_llama_gradients_match_plain_training_and_each_region_is_copied_once(device, mode):
    ours = _tiny_llama(device, dropout=0.0)
    plain = copy.deepcopy(ours)
    targets = {"targets": ["*.self_attn"]} if mode == "modules" else {}
    handle = torch_offload.apply(ours, mode=mode, min_bytes=0, **targets)
    torch_offload.reset_stats(handle.manager)
    _steps_match_plain(ours, plain, device, shape=(2, 40))
    stats = torch_offload.stats(handle.manager)
    if mode == "modules":
        assert handle.modules.stats() == stats
    assert stats["shared_saves"] > 0 and stats["saves"] == stats["restores"]
    assert stats["bytes_to_host"] == stats["distinct_bytes_saved"] < stats["saved_bytes"]
    assert stats["live_handles"] == 0 and stats["host_bytes_in_use"] == 0


def test_stats_report_kept_bytes():
    net = nn.Linear(64, 64)
    x = torch.randn(8, 64, requires_grad=True)
    hooks = torch_offload.offload_activations("all", min_bytes=4 * 8 * 64)
    with hooks:
        y = torch.relu(net(x)) * 1.0  # x (leaf) and the weight kept; relu's output offloaded
    stats = hooks.stats()
    assert stats["kept_saves"] == 2 and stats["kept_bytes"] == x.nbytes + net.weight.nbytes
    assert stats["offloaded_saves"] == 1 and stats["distinct_bytes_saved"] == 8 * 64 * 4
    hooks.reset_stats()
    assert hooks.stats()["kept_saves"] == 0 and hooks.stats()["saves"] == 0
    y.sum().backward()


def test_a_backward_that_fails_midway_leaves_no_restored_copy_held():
    # The backward's end never comes; once autograd drops the graph, no device copy may stay.
    layer = nn.Linear(32, 32)
    x = torch.randn(8, 32, requires_grad=True)
    with torch_offload.offload_activations("all", min_bytes=0) as hooks:
        h = x * 2
        z = layer(h)  # saves h (for the weight's gradient)
        loss = (torch.tanh(z) * h).sum()  # saves h again

    def fail(grad):
        # mul's backward has unpacked h; the linear's has not: h's copy is held for it
        assert hooks.regions.held_restores() == 1
        raise RuntimeError("failed midway")

    z.register_hook(fail)
    with pytest.raises(RuntimeError, match="failed midway"):
        loss.backward()
    del loss, z, h
    assert hooks.regions.held_restores() == 0


def test_restored_copy_is_dropped_after_its_last_save_is_unpacked():
    # Backward frees each activation after its last use; a shared restore must not hold every
    # layer's device copy until backward ends (measured: 34 GB held at 16k on the reference model).
    torch.manual_seed(0)
    layers = [nn.Linear(32, 32) for _ in range(4)]
    x = torch.randn(8, 32, requires_grad=True)
    held = []
    with torch_offload.offload_activations("all", min_bytes=0) as hooks:
        h = x
        inputs = []
        for layer in layers:
            inputs.append(h)
            h = torch.tanh(layer(h)) * h  # h is saved twice (by the linear and by the mul)
        loss = h.sum()

    # Fires once backward reaches the first layer's output: every later layer is done by then.
    inputs[1].register_hook(lambda g: held.append(hooks.regions.held_restores()))
    loss.backward()
    assert held == [0], f"{held[0]} restored copies still held mid-backward"
    assert hooks.stats()["restores"] == hooks.stats()["saves"]
