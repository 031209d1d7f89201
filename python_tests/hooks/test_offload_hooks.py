"""offload_activations / apply(mode="all"|"sync"): every saved activation offloaded through the ops.
Gradients must equal plain training bit for bit; layouts of saved views must survive."""
import copy

import pytest
import torch
from torch import nn

import torch_offload
from python_tests.support.devices import DEVICES
from python_tests.support.gloo_ranks import single_rank_mesh
from python_tests.support.grads import assert_same_grads
from python_tests.support.llama import _steps_match_plain, _tiny_llama

# Every test here runs with the C save hooks and with the Python ones (conftest.save_hooks).
pytestmark = pytest.mark.usefixtures("save_hooks")

MODES = ["all", "sync", "true", "legacy", True]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_llama_every_mode_matches_plain_training(device, mode):
    ours = _tiny_llama(device)
    plain = copy.deepcopy(ours)
    handle = torch_offload.apply(ours, mode=mode, min_bytes=0)
    _steps_match_plain(ours, plain, device, shape=(2, 40))
    stats = handle.stats()
    assert stats["saves"] > 0 and stats["saves"] == stats["restores"]
    assert stats["live_handles"] == 0 and stats["host_bytes_in_use"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_saved_views_keep_their_layout(device):
    # Backwards that save a transpose, a broadcast, a non-dense slice, and a tensor with its view.
    def fn(a, b, c):
        a, b, c = a * 1.0, b * 1.0, c * 1.0  # intermediates (leaves are never offloaded)
        at = a.t()
        e = c.expand(4, 6, 5)
        s = a[:, 1:4]
        return (at @ b).sum() + (e * e).sum() + (s * s).sum() + (a * at.t()).sum()

    torch.manual_seed(0)
    args = [torch.randn(6, 5, device=device), torch.randn(6, 3, device=device),
            torch.randn(1, 6, 5, device=device)]
    ref_args = [t.clone().requires_grad_() for t in args]
    our_args = [t.clone().requires_grad_() for t in args]
    fn(*ref_args).backward()
    hooks = torch_offload.offload_activations("all", min_bytes=0)
    with hooks:
        out = fn(*our_args)
    out.backward()
    for r, o in zip(ref_args, our_args):
        assert torch.equal(r.grad, o.grad)
    stats = hooks.stats()
    # 8 saves of three storages (a and its views, b, c's expansion): one copy each, restored once.
    assert stats["offloaded_saves"] == 8 and stats["shared_saves"] == 5
    assert stats["saves"] == stats["restores"] == 3


@pytest.mark.parametrize("device", DEVICES)
def test_restored_tensors_have_original_strides(device):
    from torch_offload._library.layouts import Packed as _Packed, compact_layout as _compact, rebuild as _rebuild

    manager = torch_offload.OffloadManager()
    base = torch.randn(4, 6, 5, device=device)
    same_layout = [base.transpose(0, 2), base.permute(1, 2, 0), torch.randn(4, 1, 5, device=device).expand(4, 6, 5),
                   torch.randn(1, device=device).expand(7), base.t() if base.dim() == 2 else base.mT]
    compacted = [base[:, :1].expand(4, 6, 5), base[..., ::2], torch.empty(0, 3, device=device)]
    for t in same_layout + compacted:
        src, perm, expanded = _compact(t)
        packed = _Packed(torch_offload.offload_save(src, manager.id()), t.device, perm, expanded)
        out = _rebuild(torch_offload.offload_restore(packed.handle, t.device, manager.id()), packed)
        assert torch.equal(out, t) and out.shape == t.shape
        if any(t is u for u in same_layout):
            assert out.stride() == t.stride(), (t.shape, t.stride(), out.stride())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_every_floating_dtype(device, dtype):
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("fp16 matmul on CPU is not what this tests")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).to(device, dtype)
    ref = copy.deepcopy(net)
    x = torch.randn(10, 16, device=device, dtype=dtype)
    with torch_offload.offload_activations("all", min_bytes=0):
        net(x).float().square().sum().backward()
    ref(x).float().square().sum().backward()
    assert_same_grads(net, ref)


def test_parameters_and_small_tensors_stay():
    net = nn.Linear(64, 64)
    x = torch.randn(8, 64, requires_grad=True)
    hooks = torch_offload.offload_activations("all", min_bytes=4 * 8 * 64)
    with hooks:
        y = torch.relu(net(x))  # saves x (a leaf that requires grad: kept), weight (kept), y (offloaded)
    y.sum().backward()
    stats = hooks.stats()
    assert stats["saves"] == 1 and stats["bytes_to_host"] == 8 * 64 * 4


def test_integer_and_bool_saved_tensors():
    x = torch.randn(50, 20, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_()

    def fn(t):
        idx = torch.argsort(t, dim=1)  # gather saves an int64 index
        mask = t > 0  # masked_fill/where save a bool mask
        return torch.gather(t, 1, idx).where(mask, t * 2).sum()

    with torch_offload.offload_activations("all", min_bytes=0) as hooks:
        fn(x).backward()
    fn(ref_x).backward()
    assert torch.equal(x.grad, ref_x.grad)
    assert hooks.stats()["saves"] >= 2


def test_no_state_grows_over_steps():
    model = _tiny_llama("cpu", dropout=0.0)
    handle = torch_offload.apply(model, mode="all", min_bytes=0)
    ids = torch.randint(0, 256, (1, 32))
    levels = []
    for _ in range(6):
        model(input_ids=ids, labels=ids).loss.backward()
        stats = handle.stats()
        levels.append((stats["live_handles"], stats["host_bytes_in_use"], stats["host_allocations"]))
    assert all(level[:2] == (0, 0) for level in levels)
    assert len({level[2] for level in levels[1:]}) == 1  # no new host buffers after step one


def test_sync_mode_manager_is_synchronous_without_prefetch():
    hooks = torch_offload.offload_activations("legacy")
    assert hooks.mode == "sync" and hooks.manager.synchronous() and hooks.manager.prefetch_depth() == 0


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="unknown activation offloading mode 'sometimes'"):
        torch_offload.offload_activations("sometimes")


def test_in_place_change_after_save_is_detected():
    x = torch.randn(20, requires_grad=True)
    with torch_offload.offload_activations("all", min_bytes=0):
        y = x * 2
        z = y.sin()  # saves y
    with torch.no_grad():
        y.add_(1)
    with pytest.raises(RuntimeError, match="modified"):
        z.sum().backward()


def _files(directory):
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


@pytest.mark.parametrize("device", DEVICES)
def test_disk_mode_matches_plain_training_and_leaves_no_files(device, tmp_path):
    ours = _tiny_llama(device)
    plain = copy.deepcopy(ours)
    handle = torch_offload.apply(ours, mode="disk", min_bytes=0, disk_dir=str(tmp_path))

    def no_files_left():
        assert _files(tmp_path) == []

    _steps_match_plain(ours, plain, device, shape=(2, 40), after_step=no_files_left)
    stats = handle.stats()
    assert stats["disk_bytes_written"] == stats["bytes_to_host"] > 0
    # Each step's newest file is restored from the memory it was written from (C++ tests count it).
    assert 0 < stats["disk_bytes_read"] < stats["bytes_to_device"]
    # Files just written are read back from the page cache (the count is -1 where the kernel
    # cannot tell, e.g. without RWF_NOWAIT).
    cached = stats["disk_bytes_read_from_page_cache"]
    assert cached == -1 or 0 < cached <= stats["disk_bytes_read"]
    assert stats["prefetch_hits"] > 0  # backward read files ahead of need
    assert stats["disk_files"] == 0 and stats["live_handles"] == 0


def test_disk_files_removed_after_exception_mid_step(tmp_path):
    net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 32), nn.Tanh())
    hooks = torch_offload.offload_activations("disk", min_bytes=0, disk_dir=str(tmp_path))

    def failing_step():
        with hooks:
            y = net(torch.randn(16, 32))
            hooks.manager.synchronize()
            assert hooks.stats()["disk_files"] > 0  # activations really are on disk now
            raise KeyError("boom")

    with pytest.raises(KeyError):
        failing_step()
    import gc

    gc.collect()
    hooks.manager.synchronize()
    assert _files(tmp_path) == []
    stats = hooks.stats()
    assert stats["live_handles"] == 0 and stats["disk_files"] == 0


def test_full_disk_is_a_clear_error_and_loses_nothing(tmp_path):
    a = torch.randn(8, 32, requires_grad=True)
    hooks = torch_offload.offload_activations("disk", min_bytes=0, disk_dir=str(tmp_path))
    hooks.manager._simulate_full_disk(True)
    with hooks:
        h = a * 2
        y = h.sin()  # saves h: its write fails, the data stays in host memory
        hooks.manager.synchronize()
        with pytest.raises(RuntimeError, match="disk tier failed: .*No space left on device"):
            (h + 1).cos()  # the next save (of a new tensor: h is already saved) reports it
    hooks.manager._simulate_full_disk(False)
    y.sum().backward()  # the tensor saved before the failure still restores correctly
    assert torch.equal(a.grad, 2 * (a.detach() * 2).cos())
    assert _files(tmp_path) == [] and hooks.stats()["live_handles"] == 0


def test_unwritable_disk_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    with pytest.raises(RuntimeError, match="cannot create disk_dir"):
        torch_offload.offload_activations("disk", disk_dir=str(blocker / "sub"))


def test_all_mode_spills_to_disk_over_budget(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(6)])
    ref = copy.deepcopy(net)
    x = torch.randn(32, 64)  # each saved activation: 8 KiB
    hooks = torch_offload.offload_activations("all", min_bytes=0, host_budget_bytes=24 * 1024,
                                              disk_dir=str(tmp_path))
    with hooks:
        loss = net(x).square().sum()
    stats = hooks.stats()
    assert stats["spills"] > 0 and stats["host_bytes_in_use"] <= 24 * 1024
    loss.backward()
    ref(x).square().sum().backward()
    assert_same_grads(net, ref)
    assert _files(tmp_path) == [] and hooks.stats()["live_handles"] == 0


def test_over_budget_without_disk_is_a_clear_error():
    net = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
    hooks = torch_offload.offload_activations("all", min_bytes=0, host_budget_bytes=8 * 1024)
    with pytest.raises(RuntimeError, match="host_budget_bytes=8192"):
        with hooks:
            net(torch.randn(32, 64))
    assert hooks.stats()["live_handles"] == 0


def test_dtensor_local_shards_are_offloaded():
    from torch.distributed.tensor import DTensor, Replicate, Shard

    with single_rank_mesh() as mesh:
        torch.manual_seed(0)
        w = torch.randn(16, 16)
        x = torch.randn(8, 16)

        def fn(weight, inp):
            h = torch.tanh(inp @ weight)  # saves h (a DTensor) for tanh's backward
            return (h * h).sum()

        ref_w = w.clone().requires_grad_()
        fn(ref_w, x).backward()
        dw = DTensor.from_local(w.clone(), mesh, [Replicate()]).requires_grad_()
        dx = DTensor.from_local(x.clone(), mesh, [Shard(0)])
        hooks = torch_offload.offload_activations("all", min_bytes=0)
        with hooks:
            loss = fn(dw, dx)
        assert hooks.stats()["saves"] > 0
        loss.backward()
        assert torch.equal(dw.grad.to_local(), ref_w.grad)
        assert hooks.stats()["saves"] == hooks.stats()["restores"]


def test_keep_takes_dtensors_and_survives_storage_resize():
    # FSDP2's sharded parameters are DTensors, and it frees and re-allocates unsharded parameter
    # data in place (storage resize_): kept tensors are matched by storage, not by data pointer.
    from torch.distributed.tensor import DTensor, Replicate

    with single_rank_mesh() as mesh:
        buffer = torch.randn(64, 64)
        sharded = DTensor.from_local(buffer, mesh, [Replicate()])
        hooks = torch_offload.offload_activations("all", min_bytes=0, keep=[sharded])
        storage = buffer.untyped_storage()
        storage.resize_(0)
        storage.resize_(64 * 64 * 4)
        buffer.normal_()
        x = torch.randn(64, 64, requires_grad=True)
        ref_x = x.detach().clone().requires_grad_()

        def fn(inp):  # saves the alias buffer.detach() (kept), inp (a leaf: kept), tanh's output
            return (inp * buffer.detach()).sum() + torch.tanh(inp).sum()

        with hooks:
            loss = fn(x)
        loss.backward()
        fn(ref_x).backward()
        assert torch.equal(x.grad, ref_x.grad)
        assert hooks.stats()["saves"] == 1  # only tanh's output
