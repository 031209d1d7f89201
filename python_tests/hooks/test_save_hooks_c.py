"""The C save hooks (pyext/save_hooks.cpp): built and used, what they give back, references; and the
Python hooks they stand in for, in a process where the C ones are not loaded. The other hook test
files run every test with both (conftest.save_hooks), errors included (host budget: test_offload_hooks,
node budget: test_node_budget)."""
import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import torch_offload
from torch_offload._library import loading as _library
from torch_offload.hooks import saved_regions

pytestmark = pytest.mark.usefixtures("save_hooks")


def test_the_hooks_autograd_calls_are_the_c_ones_or_the_python_ones(save_hooks):
    hooks = torch_offload.offload_activations("all", min_bytes=0)
    c_type = type(hooks.pack_hook.__self__).__name__ if hasattr(hooks.pack_hook, "__self__") else None
    assert c_type == ("SaveHooks" if save_hooks == "c" else None)


def test_saved_view_takes_a_tensor_and_a_device():
    save = torch.zeros(3)
    view = saved_regions.SavedView(save, torch.device("cpu"))
    assert view.save is save and view.device == torch.device("cpu") and view.dtensor_spec is None
    view.dtensor_spec = "spec"
    assert view.dtensor_spec == "spec"
    with pytest.raises(TypeError):
        saved_regions.SavedView(save, "cpu")  # a string, not a torch.device
    with pytest.raises(TypeError):
        saved_regions.SavedView([1, 2], torch.device("cpu"))


def test_kept_and_offloaded_saves_hold_no_extra_references():
    hooks = torch_offload.offload_activations("all", min_bytes=1 << 10)
    small = torch.randn(8, requires_grad=True) * 2  # under min_bytes: kept, returned as itself
    large = torch.randn(1024, requires_grad=True) * 2
    before_small, before_large = sys.getrefcount(small), sys.getrefcount(large)
    for _ in range(100):
        assert hooks.pack_hook(small) is small
        restored = hooks.unpack_hook(hooks.pack_hook(large))
        assert torch.equal(restored, large)
    del restored
    gc.collect()
    assert (sys.getrefcount(small), sys.getrefcount(large)) == (before_small, before_large)
    assert hooks.stats()["live_handles"] == 0


def test_an_offloaded_save_gives_the_garbage_collector_no_new_object(save_hooks):
    # A modules step saves hundreds of tensors: with one Python tensor per save handle, the step
    # crossed the collector's threshold every time (0.3 ms of a 4k step on an H100).
    if save_hooks != "c":
        pytest.skip("the C hooks' SavedView holds its handle in C++; the Python one holds a tensor")
    hooks = torch_offload.offload_activations("all", min_bytes=0)
    sources = [torch.randn(256, requires_grad=True) * 2 for _ in range(100)]
    packed = [None] * len(sources)
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for i, source in enumerate(sources):
            packed[i] = hooks.pack_hook(source)
        made = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert all(type(view) is saved_regions.SavedView for view in packed)
    assert made < 10, f"{made} objects for the collector from 100 offloaded saves"
    for view, source in zip(packed, sources):
        assert view.device == source.device and view.save.dtype == source.dtype
        assert torch.equal(hooks.unpack_hook(view), source)


def test_without_the_c_hooks_the_python_ones_run_and_give_the_same_gradients(tmp_path):
    # A process that does not load them (as where they were not built); its checkpoint runs on
    # torch's implementation, with the same gradients.
    script = tmp_path / "python_hooks.py"
    script.write_text(
        "import torch, torch_offload\n"
        "from torch_offload.hooks import saved_regions\n"
        "assert saved_regions.SavedView.__name__ == '_PythonSavedView'\n"
        "torch.manual_seed(0)\n"
        "net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 32))\n"
        "x = torch.randn(16, 32)\n"
        "net(x).square().sum().backward()\n"
        "plain = [p.grad.clone() for p in net.parameters()]\n"
        "net.zero_grad()\n"
        "hooks = torch_offload.offload_activations('all', min_bytes=0)\n"
        "assert not hasattr(hooks.pack_hook, '__self__')\n"
        "with hooks:\n"
        "    loss = net(x).square().sum()\n"
        "loss.backward()\n"
        "assert all(torch.equal(a, p.grad) for a, p in zip(plain, net.parameters()))\n"
        "assert hooks.stats()['offloaded_saves'] > 0\n"
        "from torch_offload.checkpointing import nonreentrant\n"
        "assert not nonreentrant.available()  # the checkpoint runs on torch's implementation\n"
        "net.zero_grad()\n"
        "torch_offload.checkpoint(net, x.requires_grad_(), use_reentrant=False).square().sum().backward()\n"
        "assert all(torch.equal(a, p.grad) for a, p in zip(plain, net.parameters()))\n"
        "print('ok')\n")
    env = dict(os.environ, TORCH_OFFLOAD_PYTHON_SAVE_HOOKS="1", TORCH_OFFLOAD_LIBRARY=_library.load_library(),
               PYTHONPATH=str(Path(torch_offload.__file__).resolve().parents[1]))
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_a_cycle_through_the_c_hooks_is_collected(save_hooks):
    if save_hooks != "c":
        pytest.skip("the C hooks' own type")
    module = _library.load_save_hooks()
    manager = torch_offload.OffloadManager()
    filter_id = manager.add_save_filter(0, False)

    class Sentinel:
        pass

    sentinel, box = Sentinel(), []
    alive = weakref.ref(sentinel)

    def python_side(t, box=box, sentinel=sentinel):  # holds the box that will hold the hooks
        return t

    hooks = module.SaveHooks(manager.id(), filter_id, 0, {}, python_side, python_side, python_side, python_side)
    box.append(hooks)
    del hooks, python_side, sentinel, box
    gc.collect()
    assert alive() is None
    with pytest.raises(TypeError):
        module.SaveHooks(manager.id(), filter_id, 0, [], print, print, print, print)  # not a dict
    manager.remove_save_filter(filter_id)
