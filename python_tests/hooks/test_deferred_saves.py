"""Deferred saves of the C hooks (pyext/deferred_saves.h): inside a batch (batch_copies, mode "modules")
a large op output is held and goes to the engine when the batch ends; what backward gets back, the
errors, and what is offloaded are as if each save had gone to the engine at once."""
import threading

import pytest
import torch

import torch_offload
from torch_offload._library import loading as _library
from torch_offload.hooks import saved_regions

from python_tests.support.devices import DEVICES

pytestmark = pytest.mark.skipif(_library.load_save_hooks() is None, reason="the C save hooks were not built")


def _hooks(**options):
    options.setdefault("min_bytes", 1024)
    return torch_offload.offload_activations("all", batch_copies=True, warn_on_exit=False, **options)


def _output(n=4096, device="cpu"):
    return torch.randn(n, device=device, requires_grad=True) * 2  # an op's output, 16 KB


@pytest.mark.parametrize("device", DEVICES)
def test_a_save_in_a_batch_is_held_then_offloaded_at_its_end(device):
    hooks = _hooks()
    x = _output(device=device)
    hooks._begin_batch()
    view = hooks.pack_hook(x)
    assert type(view) is saved_regions.SavedView and view.pending and view.save is None
    assert hooks.stats()["saves"] == 0, "nothing reached the engine inside the batch"
    hooks._end_batch()
    assert not view.pending and view.save is not None and view.save.device.type == "cpu"
    assert hooks.stats()["saves"] == 1 and hooks.stats()["bytes_to_host"] == x.nbytes
    restored = hooks.unpack_hook(view)
    assert restored.device == x.device and torch.equal(restored, x)


def test_outside_a_batch_or_without_batch_copies_a_save_goes_to_the_engine_at_once():
    for hooks in (_hooks(), torch_offload.offload_activations("all", min_bytes=1024)):
        view = hooks.pack_hook(_output())
        assert not view.pending and view.save is not None


def test_weights_and_small_tensors_are_not_held_leaves_without_grad_are():
    hooks = _hooks()
    weight = torch.nn.Parameter(torch.randn(4096))
    frozen = torch.nn.Parameter(torch.randn(4096), requires_grad=False)
    small = torch.randn(8, requires_grad=True) * 2  # under min_bytes
    leaf = torch.randn(4096)  # a leaf without grad that is no parameter (rotary cos / sin)
    hooks._begin_batch()
    assert hooks.pack_hook(weight) is weight
    assert type(hooks.pack_hook(weight.t())) is torch.Tensor
    assert hooks.pack_hook(frozen) is frozen and hooks.pack_hook(small) is small
    leaf_view = hooks.pack_hook(leaf)
    assert leaf_view.pending
    hooks._end_batch()
    assert not leaf_view.pending and leaf_view.save is not None
    assert torch.equal(hooks.unpack_hook(leaf_view), leaf)


def test_a_held_save_unpacked_before_its_batch_ends_is_the_tensor_itself():
    hooks = _hooks()
    x = _output()
    hooks._begin_batch()
    view = hooks.pack_hook(x)
    assert hooks.unpack_hook(view) is x
    hooks._end_batch()
    assert torch.equal(hooks.unpack_hook(view), x)


def test_saves_of_one_storage_in_a_batch_share_one_copy():
    hooks = _hooks()
    x = _output()
    hooks._begin_batch()
    views = [hooks.pack_hook(x), hooks.pack_hook(x.view(64, 64).t()), hooks.pack_hook(x[:2048])]
    hooks._end_batch()
    stats = hooks.stats()
    assert stats["offloaded_saves"] == 3 and stats["shared_saves"] == 2 and stats["bytes_to_host"] == x.nbytes
    assert torch.equal(hooks.unpack_hook(views[1]), x.view(64, 64).t())
    assert torch.equal(hooks.unpack_hook(views[2]), x[:2048])


def test_a_save_changed_in_place_before_the_batch_ends_is_not_copied_and_raises():
    hooks = _hooks()
    x = _output()
    hooks._begin_batch()
    view = hooks.pack_hook(x)
    x.add_(1)
    hooks._end_batch()
    assert hooks.stats()["saves"] == 0
    with pytest.raises(RuntimeError, match="modified in place after it was saved"):
        hooks.unpack_hook(view)


def test_a_save_changed_in_place_after_the_batch_raises_as_before():
    hooks = _hooks()
    x = _output()
    hooks._begin_batch()
    view = hooks.pack_hook(x)
    hooks._end_batch()
    x.add_(1)
    with pytest.raises(RuntimeError, match="modified in place after it was saved"):
        hooks.unpack_hook(view)


def test_a_save_autograd_dropped_before_the_batch_ends_is_not_copied():
    hooks = _hooks()
    hooks._begin_batch()
    hooks.pack_hook(_output())  # the view is dropped at once
    kept = hooks.pack_hook(_output())
    hooks._end_batch()
    assert hooks.stats()["saves"] == 1 and kept.save is not None


def test_only_the_outermost_batch_end_offloads():
    hooks = _hooks()
    hooks._begin_batch()
    outer = hooks.pack_hook(_output())
    hooks._begin_batch()
    inner = hooks.pack_hook(_output())
    hooks._end_batch()
    assert outer.pending and inner.pending
    hooks._end_batch()
    assert not outer.pending and not inner.pending and hooks.stats()["saves"] == 2


def test_another_threads_saves_go_to_the_engine_at_once():
    hooks = _hooks()
    hooks._begin_batch()
    views = []
    thread = threading.Thread(target=lambda: views.append(hooks.pack_hook(_output())))
    thread.start()
    thread.join()
    mine = hooks.pack_hook(_output())
    assert not views[0].pending and views[0].save is not None and mine.pending
    hooks._end_batch()
    assert not mine.pending


def test_an_engine_error_at_the_batch_end_is_raised_there_and_the_save_stays_held():
    hooks = _hooks(host_budget_bytes=8 * 1024)
    x = _output()  # 16 KB: over the budget
    hooks._begin_batch()
    view = hooks.pack_hook(x)
    with pytest.raises(RuntimeError, match="host_budget_bytes=8192"):
        hooks._end_batch()
    assert not view.pending and view.save is None
    assert hooks.unpack_hook(view) is x
    hooks._begin_batch()  # the batch was ended all the same: the next one works
    hooks._end_batch()


@pytest.mark.parametrize("device", DEVICES)
def test_held_saves_in_a_graph_give_plain_training_gradients(device):
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(device)
    x = torch.randn(32, 64, device=device)
    layer(x).square().sum().backward()
    expected = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    hooks = _hooks()
    with hooks:
        out = layer(x)
    assert hooks.stats()["saves"] > 0
    out.square().sum().backward()
    for p, g in zip(layer.parameters(), expected):
        assert torch.equal(p.grad, g)
