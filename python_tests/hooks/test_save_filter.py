"""The save hooks' filter in the engine (csrc/save_filter.h, torch_offload/save_filter.py): plain
tensors are decided by one op call, what the engine cannot tell goes through the Python path, and
the two together decide, count and record as the Python hooks alone did."""
import gc
import warnings

import pytest
import torch
from torch import nn

import torch_offload
from python_tests.support.devices import DEVICES
from python_tests.support.llama import _tiny_llama

# Every test here runs with the C save hooks and with the Python ones (conftest.save_hooks).
pytestmark = pytest.mark.usefixtures("save_hooks")


def _mlp_step(net, x, hooks):
    with hooks:
        loss = net(x * 2).pow(2).sum()
    loss.backward()


@pytest.mark.parametrize("device", DEVICES)
def test_plain_saves_are_decided_by_the_engine(device):
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).to(device)
    x = torch.randn(16, 64, device=device, requires_grad=True)
    hooks = torch_offload.offload_activations("all", min_bytes=0, keep=net.parameters())
    _mlp_step(net, x, hooks)
    engine = hooks.filter.counts()
    assert engine["offloaded"] == hooks.stats()["offloaded_saves"] > 0
    assert engine["kept_other"] > 0  # the weights' views
    assert hooks.counts.offloaded == 0  # nothing took the Python path
    assert hooks.counts.snapshot()[0] == engine["offloaded"]


def test_frozen_parameter_stays_and_a_plain_leaf_is_offloaded_without_keep():
    # No `keep`: the engine cannot tell a frozen nn.Parameter from an input leaf; Python does.
    frozen = nn.Linear(32, 32)
    frozen.requires_grad_(False)
    x = torch.randn(8, 32)  # a leaf without grad, not a parameter: an activation to offload
    scale = torch.randn(8, 32, requires_grad=True)
    reference_scale = scale.detach().clone().requires_grad_()
    (frozen(x * reference_scale) * x).sum().backward()
    hooks = torch_offload.offload_activations("all", min_bytes=0)
    with hooks:
        loss = (frozen(x * scale) * x).sum()
    stats = hooks.stats()
    loss.backward()
    assert torch.equal(scale.grad, reference_scale.grad)
    assert hooks.counts.kept_other == 1  # frozen.weight.t(), on the Python path
    # x: the hooks tell the engine it is no weight, and the engine offloads it (and counts it)
    assert hooks.counts.offloaded == 0 and hooks.filter.counts()["offloaded"] >= 1
    assert stats["kept_bytes"] == frozen.weight.nbytes
    assert stats["saved_tensors"] == stats["offloaded_saves"] + stats["kept_saves"]


def test_leaves_that_isinstance_calls_parameters_stay():
    # isinstance(t, nn.Parameter) is also true for a tensor flagged `_is_param` (custom parameter
    # types): such a leaf without grad, and views of it, stay on the device like a frozen weight.
    flagged = torch.randn(32, 32)
    flagged._is_param = True
    frozen = nn.Parameter(torch.randn(32, 32), requires_grad=False)
    plain = torch.randn(32, 32)
    q = torch.randn(32, 32, requires_grad=True)
    reference = q.detach().clone().requires_grad_()

    def loss_of(q):
        return (q * flagged).sum() + (q * frozen.t()).sum() + (q * plain[None]).sum()

    loss_of(reference).backward()
    hooks = torch_offload.offload_activations("all", min_bytes=0)
    with hooks:
        loss = loss_of(q)
    loss.backward()
    assert torch.equal(q.grad, reference.grad)
    assert hooks.counts.kept_other == 2  # flagged, frozen.t(); plain (a view) offloaded
    assert hooks.stats()["kept_bytes"] == flagged.nbytes + frozen.nbytes


@pytest.mark.parametrize("device", DEVICES)
def test_leaves_without_grad_are_decided_by_the_engine_once_the_hooks_rule_out_a_weight(device):
    # Like rotary embeddings' cos / sin: computed without grad, viewed (unsqueeze) and saved by
    # several products. The hooks rule out a frozen weight in Python and the engine does the rest:
    # one shared copy for the views, and a leaf under min_bytes kept without asking.
    cos = torch.randn(64, 32, device=device)  # 8 KiB, a leaf without grad
    small = torch.randn(4, device=device)  # 16 bytes

    def loss_of(q):
        return (q * cos.unsqueeze(0)).sum() + (q.exp() * cos.unsqueeze(0)).sum() + (q[0, :4] * small).sum()

    q = torch.randn(64, 32, device=device, requires_grad=True)
    reference = q.detach().clone().requires_grad_()
    loss_of(reference).backward()
    hooks = torch_offload.offload_activations("all", min_bytes=1024)
    with hooks:
        loss = loss_of(q)
    stats = hooks.stats()
    loss.backward()
    assert torch.equal(q.grad, reference.grad)
    assert hooks.counts.offloaded == 0 and hooks.counts.under_min_bytes == 0  # no Python path
    engine = hooks.filter.counts()
    assert engine["offloaded"] == 3  # cos's two views, q.exp()
    assert engine["under_min_bytes"] == 1 and engine["largest_under_min_bytes"] == small.nbytes
    assert stats["shared_saves"] == 1  # cos's second view shares its first copy


def test_under_min_bytes_warning_names_the_largest_tensor_from_the_engine():
    net = nn.Linear(16, 16)
    x = torch.randn(4, 16)
    hooks = torch_offload.offload_activations("all", min_bytes=1 << 20, keep=net.parameters())
    with pytest.warns(torch_offload.NothingOffloadedWarning, match=r"the largest: 256 bytes"):
        with hooks:
            y = torch.relu(net(x))
    y.sum().backward()
    assert hooks.filter.counts()["largest_under_min_bytes"] == 256


def test_the_filter_goes_with_its_hooks():
    manager = torch_offload.OffloadManager()
    hooks = torch_offload.offload_activations("all", manager=manager)
    filter_id = hooks.filter.id
    assert manager.save_filter_counts(filter_id)["offloaded"] == 0
    del hooks
    gc.collect()
    with pytest.raises(RuntimeError, match=f"no save filter with id {filter_id}"):
        manager.save_filter_counts(filter_id)


def test_kept_saves_of_two_hook_sets_on_one_manager_are_summed_and_reset():
    manager = torch_offload.OffloadManager()
    net = nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    first = torch_offload.offload_activations("all", manager=manager, keep=net.parameters())
    second = torch_offload.offload_activations("all", manager=manager, keep=net.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_offload.NothingOffloadedWarning)
        for hooks in (first, second):
            with hooks:
                net(x * 2).sum().backward()
    stats = torch_offload.stats(manager)
    assert stats["kept_saves"] == 4 and stats["kept_bytes"] == 2 * (net.weight.nbytes + x.nbytes)
    torch_offload.reset_stats(manager)
    assert torch_offload.stats(manager)["kept_saves"] == 0


def test_modules_report_records_each_storage_once_per_forward():
    model = _tiny_llama("cpu", dropout=0.0)
    ids = torch.randint(0, 256, (1, 16))
    handle = torch_offload.apply(model, "modules", targets=["*.self_attn"], min_bytes=0)
    for _ in range(2):  # the record starts again with each forward
        loss = model(input_ids=ids, labels=ids).loss
        report = handle.report()
        loss.backward()
    assert report["storages"] > 0
    assert report["expected_bytes"] == handle.modules.hooks.filter.report()["expected_bytes"]
    assert report["expected_bytes"] <= handle.stats()["distinct_bytes_saved"]


class _Subclass(torch.Tensor):
    pass


def test_saves_decided_in_python_are_in_the_engines_record():
    # x, a tensor subclass, takes the Python path; relu's output the engine's: one record.
    x = torch.randn(8, 32).as_subclass(_Subclass)
    scale = torch.randn(8, 32, requires_grad=True)
    hooks = torch_offload.offload_activations("all", min_bytes=0, record_offloaded=True)
    with hooks:
        loss = ((x * scale).relu() * 2).sum()
    report = hooks.filter.report()
    assert hooks.counts.offloaded >= 1 and hooks.filter.counts()["offloaded"] >= 1
    assert report["storages"] == 2  # x (saved by the product) and relu's output
    assert report["expected_bytes"] == 2 * x.nbytes
    loss.backward()
    hooks.filter.reset_record()
    assert hooks.filter.report()["storages"] == 0
