"""A step that offloaded nothing says why, once (torch_offload/hooks/nothing_offloaded.py): every saved
tensor under min_bytes, or kept (parameters, buffers, keep=, tensors the engine cannot copy, which
stay resident rather than failing the step); steps that offload, or save nothing, do not warn."""
import warnings

import pytest
import torch

import torch_offload
from python_tests.support.llama import _tiny_llama, _train_step


def test_all_mode_under_min_bytes_warns_once_with_the_reason():
    model = _tiny_llama("cpu")
    torch_offload.apply(model, "all")  # default min_bytes=1 MiB: larger than every activation here
    with pytest.warns(torch_offload.NothingOffloadedWarning,
                      match=r"offloaded nothing: \d+ saved tensors were under min_bytes=1048576 "
                            r"\(the largest: \d+ bytes\); pass a smaller min_bytes"):
        _train_step(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train_step(model)  # once only


def test_offloading_steps_do_not_warn():
    for mode, options in (("all", {"min_bytes": 0}), ("modules", {"min_bytes": 0, "targets": ["*.mlp"]}),
                          ("hidden_states", {})):
        model = _tiny_llama("cpu")
        handle = torch_offload.apply(model, mode, **options)
        with warnings.catch_warnings():
            warnings.simplefilter("error", torch_offload.NothingOffloadedWarning)
            _train_step(model)
            with torch.no_grad():  # nothing saved at all: no warning either
                model(input_ids=torch.randint(0, 256, (1, 16)))
        assert handle.stats()["saves"] > 0


def test_modules_mode_under_min_bytes_warns():
    model = _tiny_llama("cpu")
    torch_offload.apply(model, "modules", targets=["*.mlp"])
    with pytest.warns(torch_offload.NothingOffloadedWarning, match="under min_bytes=1048576"):
        _train_step(model)


def test_context_where_every_saved_tensor_is_kept_warns():
    w = torch.nn.Parameter(torch.randn(64, 64))
    x = torch.randn(8, 64)
    with pytest.warns(torch_offload.NothingOffloadedWarning,
                      match=r"all 1 saved tensors were parameters, buffers or views of them"):
        with torch_offload.offload_activations("all", min_bytes=0, keep=[x]):
            y = x @ w  # saves x (kept) for w's gradient
    y.sum().backward()
    assert torch.equal(w.grad, x.t() @ torch.ones(8, 64))


def test_hooks_keep_tensors_they_cannot_copy(manager):
    # A saved nested tensor (strided layout, but no sizes) stays resident rather than failing the step.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parts = [torch.randn(2, 4), torch.randn(3, 4)]
        nested = torch.nested.nested_tensor(parts, requires_grad=True)
        ones = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)])
    with pytest.warns(torch_offload.NothingOffloadedWarning, match="all 1 saved tensors were"):
        with torch_offload.offload_activations("all", min_bytes=0, manager=manager):
            y = (nested * 1).sin()  # sin saves its (nested, non-leaf) input
    y.backward(ones)
    for grad, part in zip(nested.grad.unbind(), parts):
        assert torch.equal(grad, part.cos())
