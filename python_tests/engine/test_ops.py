"""The two ops and the OffloadManager class, called directly."""
import copy

import pytest
import torch
from torch.library import opcheck

import torch_offload
from python_tests.support.devices import DEVICES, cuda_only

save = torch.ops.offload.offload_save
restore = torch.ops.offload.offload_restore

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8,
          torch.bool]


def _random(shape, dtype, device):
    if dtype == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-100, 100, shape, device=device, dtype=dtype)
    return torch.randn(shape, device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(device, dtype, manager):
    x = _random((3, 5, 7), dtype, device)
    handle = save(x, manager.id())
    assert handle.device.type == "cpu" and handle.shape == x.shape and handle.dtype == dtype
    y = restore(handle, x.device, manager.id())
    assert y.device == x.device and torch.equal(x, y)


@pytest.mark.parametrize("device", DEVICES)
def test_views_and_empty_tensors(device, manager):
    base = torch.randn(6, 8, device=device)
    for x in (base.t(), base[:, ::2], base[2:4], base.expand(2, 6, 8), torch.empty(0, 3, device=device)):
        y = restore(save(x, manager.id()), x.device, manager.id())
        assert y.shape == x.shape and torch.equal(x, y)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device, manager):
    x = torch.randn(4, 6, device=device, requires_grad=True)
    opcheck(save.default, (x, manager.id()))
    handle = save(x.detach(), manager.id())
    opcheck(restore.default, (handle, torch.device(device), manager.id()))


def test_ops_are_differentiable_copies(manager):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: restore(save(t, manager.id()), t.device, manager.id()), (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_restore_twice_gives_the_same_data(device, manager):
    # Needed by backward(retain_graph=True), which unpacks saved tensors again.
    x = torch.randn(128, device=device)
    handle = save(x, manager.id())
    assert torch.equal(restore(handle, x.device, manager.id()), x)
    assert torch.equal(restore(handle, x.device, manager.id()), x)


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_change_after_save_is_an_error(device, manager):
    x = torch.randn(16, device=device)
    handle = save(x, manager.id())
    x.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place after it was saved"):
        restore(handle, x.device, manager.id())


def test_meta_tensor_is_rejected(manager):
    # It used to be accepted, and an uninitialised CPU tensor came back.
    # With the Python package loaded its fake kernel answers first (ValueError); the C++ kernel
    # alone raises RuntimeError("offload_save: got a meta tensor ...").
    with pytest.raises(ValueError, match="on the meta device"):
        save(torch.empty(4, 4, device="meta"), manager.id())


def test_unknown_manager_is_an_error():
    with pytest.raises(RuntimeError, match="unknown OffloadManager id 987654"):
        save(torch.ones(2), 987654)


def test_host_budget_is_named_and_nothing_is_lost():
    manager = torch_offload.OffloadManager(host_budget_bytes=64 * 1024)
    kept = save(torch.ones(4096), manager.id())  # 16 KiB, fits
    with pytest.raises(RuntimeError, match="host_budget_bytes=65536"):
        save(torch.ones(64 * 1024), manager.id())  # 256 KiB, does not
    stats = manager.stats()
    assert stats["live_handles"] == 1 and stats["saves"] == 1
    assert torch.equal(restore(kept, torch.device("cpu"), manager.id()), torch.ones(4096))


def test_plain_host_tensor_restores_as_a_copy(manager):
    t = torch.arange(10.0)
    out = restore(t, torch.device("cpu"), manager.id())
    assert torch.equal(out, t) and out.data_ptr() != t.data_ptr()


@pytest.mark.parametrize("device", DEVICES)
def test_pool_reuse_means_no_new_host_allocations_in_steady_state(device, manager):
    def step():
        handles = [save(torch.randn(1000 + 10 * i, device=device), manager.id()) for i in range(8)]
        for h in reversed(handles):
            restore(h, torch.device(device), manager.id())
        del handles
        manager.synchronize()

    step()
    after_first = manager.stats()["host_allocations"]
    manager.reset_stats()
    for _ in range(3):
        step()
    stats = manager.stats()
    assert stats["host_allocations"] == after_first
    assert stats["pool_misses"] == 0 and stats["pool_hits"] == 24
    assert stats["host_bytes_in_use"] == 0 and stats["live_handles"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_stats_count_bytes_each_way(device, manager):
    x = torch.randn(256, device=device)
    restore(save(x, manager.id()), x.device, manager.id())
    stats = manager.stats()
    assert stats["saves"] == 1 and stats["restores"] == 1
    assert stats["bytes_to_host"] == stats["bytes_to_device"] == 1024
    manager.reset_stats()
    assert manager.stats()["saves"] == 0


def test_manager_config_and_pickle_round_trip(tmp_path):
    manager = torch_offload.OffloadManager(max_in_flight=3, prefetch_depth=2, host_budget_bytes=1 << 30)
    assert (manager.max_in_flight(), manager.prefetch_depth(), manager.host_budget_bytes()) == (3, 2, 1 << 30)

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.manager = manager

        def forward(self, x):
            return restore(save(x, self.manager.id()), x.device, self.manager.id())

    scripted = torch.jit.script(Holder())
    path = tmp_path / "holder.pt"
    torch.jit.save(scripted, str(path))
    loaded = torch.jit.load(str(path))
    assert loaded.manager.max_in_flight() == 3 and loaded.manager.host_budget_bytes() == 1 << 30
    assert loaded.manager.id() != manager.id()
    # The prefetch depth can change; a copy takes the depth it has then.
    manager.set_prefetch_depth(5)
    assert manager.prefetch_depth() == 5 and copy.deepcopy(manager).prefetch_depth() == 5
    with pytest.raises(RuntimeError, match="prefetch_depth must be >= 0, got -1"):
        manager.set_prefetch_depth(-1)
    x = torch.randn(5)
    assert torch.equal(loaded(x), x)
    assert loaded.manager.stats()["bytes_to_host"] == 20


def test_bad_config_is_an_error():
    with pytest.raises(RuntimeError, match="max_in_flight must be >= 0"):
        torch_offload.OffloadManager(max_in_flight=-1)
    with pytest.raises(RuntimeError, match="host_budget_bytes must be >= 0"):
        torch_offload.OffloadManager(host_budget_bytes=-5)


@cuda_only
@pytest.mark.cuda
def test_cuda_handles_are_pinned_and_prefetched(manager):
    xs = [torch.randn(1 << 16, device="cuda") for _ in range(6)]
    handles = [save(x, manager.id()) for x in xs]
    assert all(h.is_pinned() for h in handles)
    for x, h in zip(reversed(xs), reversed(handles)):
        assert torch.equal(restore(h, torch.device("cuda"), manager.id()), x)
    stats = manager.stats()
    assert stats["pinned"] == 1 and stats["prefetch_hits"] == 5


@cuda_only
@pytest.mark.cuda
def test_cuda_source_memory_is_released_after_copy(manager):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    x = torch.randn(1 << 22, device="cuda")  # 16 MiB
    handle = save(x, manager.id())
    del x
    manager.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert restore(handle, torch.device("cuda"), manager.id()).shape == (1 << 22,)
