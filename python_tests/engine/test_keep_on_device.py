"""keep_on_device_bytes: the newest saves stay on the GPU uncopied (the engine's window,
csrc/device_window.h). Every mode trains exactly as before with it, the kept restores are
counted, and the option is refused where it cannot apply, naming it. The engine's own tests (with
a fake asynchronous device) are tests/test_manager_window.cpp; here the CUDA cases run the window
for real."""
import copy

import pytest
import torch

import torch_offload
from python_tests.support.devices import cuda_only
from torch_offload.hooks import link_budget, node_link
from torch_offload.hooks.link_budget import window_for
from torch_offload.modes.auto.controller import keep_on_device_bytes_for
from torch_offload.modes.auto.trials import GB
from python_tests.support.llama import _steps_match_plain, _tiny_llama

# Every test here runs with the C save hooks and with the Python ones (conftest.save_hooks).
pytestmark = pytest.mark.usefixtures("save_hooks")


def test_the_manager_reports_and_copies_its_window():
    manager = torch_offload.OffloadManager(keep_on_device_bytes=1 << 20)
    assert manager.keep_on_device_bytes() == 1 << 20
    assert copy.deepcopy(manager).keep_on_device_bytes() == 1 << 20
    assert torch_offload.OffloadManager().keep_on_device_bytes() == 0
    assert {"restores_kept_on_device", "bytes_kept_on_device", "window_bytes"} <= set(manager.stats())


def test_cpu_tensors_are_copied_as_usual():
    # The window is for device memory: a CPU tensor has nothing to spare by staying.
    manager = torch_offload.OffloadManager(keep_on_device_bytes=1 << 20)
    x = torch.randn(64)
    handle = torch.ops.offload.offload_save(x, manager.id())
    assert torch.equal(torch.ops.offload.offload_restore(handle, torch.device("cpu"), manager.id()), x)
    stats = manager.stats()
    assert stats["bytes_to_host"] == x.nbytes and stats["restores_kept_on_device"] == 0


@pytest.mark.parametrize("options, named", [
    (dict(keep_on_device_bytes=-1), "keep_on_device_bytes must be >= 0"),
    (dict(keep_on_device_bytes=1024, synchronous=True), "synchronous=True"),
    (dict(keep_on_device_bytes=1024, disk_dir="/tmp"), "disk_dir"),
])
def test_the_window_is_refused_where_it_cannot_apply(options, named):
    with pytest.raises(RuntimeError, match=named):
        torch_offload.OffloadManager(**options)


def test_modes_take_the_option_and_sync_refuses_it():
    model = _tiny_llama("cpu", 0.0)
    with pytest.raises(RuntimeError, match="synchronous=True"):
        torch_offload.apply(model, "sync", keep_on_device_bytes=1 << 20)
    for mode in ("hidden_states", "selective", "all"):
        handle = torch_offload.apply(model, mode, keep_on_device_bytes=1 << 20)
        assert handle.manager.keep_on_device_bytes() == 1 << 20
        handle.remove()
    with pytest.raises(TypeError, match="sizes it from the memory left"):
        torch_offload.apply(model, "auto", keep_on_device_bytes=1 << 20)


def test_auto_sizes_the_window_from_the_room_under_the_budget():
    block = 0.3 * GB  # bytes one block offloads
    assert keep_on_device_bytes_for(10.0, 9.0, block) == int(2 * block)  # two blocks' worth
    assert keep_on_device_bytes_for(10.0, 9.5, block) == int(0.45 * GB)  # the room left, less a margin
    assert keep_on_device_bytes_for(10.0, 9.7, block) == 0  # less than one block: not worth a trial
    assert keep_on_device_bytes_for(10.0, 11.0, block) == 0
    assert keep_on_device_bytes_for(10.0, 9.0, 0) == 0  # nothing offloaded


def _stats_after_steps(handle):
    torch.cuda.synchronize()
    return handle.stats()


@cuda_only
@pytest.mark.parametrize("mode, options", [
    ("hidden_states", {}),
    ("selective", dict(policy="attention+qkv+out_proj")),
    ("selective", dict(policy="attention", use_reentrant=True)),
    ("all", dict(min_bytes=0)),
    ("modules", dict(targets=["*.self_attn"], min_bytes=0)),
])
@pytest.mark.parametrize("keep_bytes", [20 << 10, 1 << 30])
def test_every_mode_trains_exactly_as_before_with_saves_kept(mode, options, keep_bytes):
    # 20 KiB keeps the last save or few (a block input is 16 KiB: the rest is pushed out and
    # copied), 1 GiB keeps them all.
    ours, reference = _tiny_llama("cuda", 0.0), _tiny_llama("cuda", 0.0)
    if mode in ("hidden_states", "selective"):  # these replace checkpointing: compare with it
        reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = torch_offload.apply(ours, mode, keep_on_device_bytes=keep_bytes, **options)
    _steps_match_plain(ours, reference, "cuda", steps=3)
    stats = _stats_after_steps(handle)
    assert stats["restores_kept_on_device"] > 0
    assert stats["window_bytes"] == 0, "every kept save was restored or freed"
    if keep_bytes == 1 << 30:
        assert stats["bytes_to_host"] == 0, "everything fit in the window"
    else:
        assert stats["bytes_to_host"] > 0, "the window pushed the older saves out"
    handle.remove()


@cuda_only
def test_kept_saves_are_dropped_with_a_forward_that_has_no_backward():
    model = _tiny_llama("cuda", 0.0)
    handle = torch_offload.apply(model, "all", min_bytes=0, keep_on_device_bytes=1 << 30)
    ids = torch.randint(0, 256, (2, 32), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    assert handle.stats()["window_bytes"] > 0
    del loss
    assert handle.stats()["window_bytes"] == 0 and handle.stats()["live_handles"] == 0
    handle.remove()


@cuda_only
def test_auto_tries_the_fastest_candidate_again_with_saves_kept_within_the_budget():
    ours, reference = _tiny_llama("cuda", 0.0), _tiny_llama("cuda", 0.0)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # A budget with room to spare: the kept trial fits whatever it keeps.
    handle = torch_offload.apply(ours, "auto", trial_steps=1, memory_budget_gb=1000.0,
                                 candidates=["hidden_states", "selective:attention"])
    _steps_match_plain(ours, reference, "cuda", steps=7)
    assert handle.auto.planned
    # (the window trials; auto's tail and kept-product trials come after them: test_auto_unchecked_tail.py,
    # test_auto_kept_products.py)
    tried = handle.auto.results[:2]
    kept = [r for r in handle.auto.results[2:] if not r.tail_blocks and not r.kept_mlp_blocks]
    fastest = min(tried, key=lambda r: r.step_s)
    assert 1 <= len(kept) <= 2 and kept[0].candidate == fastest.candidate
    for row in kept:
        base = next(r for r in tried if r.candidate == row.candidate)
        # Two blocks' offloaded bytes (the budget leaves room for far more).
        assert row.keep_on_device_bytes == int(2 * base.bytes_to_host / 3)
        # The window lives until the last blocks' backward: it adds to the peak measured until then.
        assert row.predicted_peak_gb == pytest.approx(
            max(base.peak_allocated_gb, base.early_peak_gb + row.keep_on_device_gb))
        assert f"| {row.keep_on_device_gb:.2f} |" in handle.explain()
    chosen = next(r for r in handle.auto.results if r.chosen)
    assert handle.auto.chosen.keep_on_device_bytes == chosen.keep_on_device_bytes
    assert handle.manager.keep_on_device_bytes() == chosen.keep_on_device_bytes
    handle.remove()


def test_the_window_can_be_resized_between_steps():
    manager = torch_offload.OffloadManager()
    manager.set_keep_on_device_bytes(1 << 20)
    assert manager.keep_on_device_bytes() == 1 << 20
    assert copy.deepcopy(manager).keep_on_device_bytes() == 1 << 20
    with pytest.raises(RuntimeError, match="synchronous=True"):
        torch_offload.OffloadManager(synchronous=True).set_keep_on_device_bytes(1 << 20)


def test_the_link_budget_keeps_what_the_link_cannot_carry_during_the_forward():
    assert window_for(10e9, 0.1, 0.0, 50e9) == int(5e9 * link_budget.MARGIN)  # 5 GB left over
    assert window_for(4e9, 0.1, 0.0, 50e9) == 0  # the link carries it all
    assert window_for(0, 0.1, 0.0, 50e9) == 0
    # A forward of 0.2 s that stood 0.15 s waiting on copies computed for 0.05 s: 2.5 GB carried.
    assert window_for(8e9, 0.2, 0.15, 50e9) == pytest.approx(5.5e9 * link_budget.MARGIN, abs=2)


def test_auto_link_budget_is_for_the_modes_without_recompute():
    model = _tiny_llama("cpu", 0.0)
    for mode in ("hidden_states", "selective", "sync"):
        with pytest.raises(ValueError, match="keep_on_device_bytes='auto'"):
            torch_offload.apply(model, mode, keep_on_device_bytes="auto")
    with pytest.raises(ValueError, match="keep_on_device_bytes='auto' is taken by"):
        torch_offload.OffloadManager(keep_on_device_bytes="auto")
    for mode, options in (("all", {}), ("modules", dict(targets=["*.self_attn"]))):
        handle = torch_offload.apply(model, mode, keep_on_device_bytes="auto", min_bytes=0, **options)
        ids = torch.randint(0, 256, (2, 32))
        model(input_ids=ids, labels=ids).loss.backward()  # on CPU: nothing measured, nothing kept
        assert handle.link_budget.history == [] and handle.manager.keep_on_device_bytes() == 0
        handle.remove()
        assert not model._forward_hooks and not model._forward_pre_hooks


@cuda_only
@pytest.mark.parametrize("mode, options", [("all", dict(min_bytes=0)),
                                           ("modules", dict(targets=["*.self_attn"], min_bytes=0))])
def test_auto_link_budget_sizes_the_window_each_step_and_trains_as_before(mode, options, monkeypatch):
    ours, plain = _tiny_llama("cuda", 0.0), _tiny_llama("cuda", 0.0)
    handle = torch_offload.apply(ours, mode, keep_on_device_bytes="auto", **options)
    _steps_match_plain(ours, plain, "cuda", steps=2)
    (saved, seconds, stalled, window), = handle.link_budget.history  # measured after the first step
    assert saved > 0 and seconds > 0 <= stalled and window == window_for(saved, seconds, stalled, node_link.link_bandwidth(
        torch.device("cuda")))
    assert handle.manager.keep_on_device_bytes() == window
    # A link of 1 byte/s carries nothing: the next steps keep every save on the GPU.
    monkeypatch.setitem(node_link._bandwidth, torch.cuda.current_device(), 1.0)
    _steps_match_plain(ours, plain, "cuda", steps=2)
    assert handle.link_budget.window >= saved
    torch_offload.reset_stats(handle.manager)
    _steps_match_plain(ours, plain, "cuda", steps=1)
    stats = handle.stats()
    assert stats["bytes_to_host"] == 0 and stats["restores_kept_on_device"] > 0
    handle.remove()
